//! FORD (fixed or with bug switches) and Pandora as a [`Protocol`], on the simulated cluster
//! or on a real fabric ([`MnMemory`]: an MN process loads its share, a CN process makes
//! coordinators on [`AnyContext`]s).
//!
//! Recovery is the heartbeat failure detector and [`RecoveryManager`] of `dmem-ford`
//! (Pandora §3.2.2: active-link termination, log recovery with roll forward / back and
//! truncation, stray-lock notification so PILL can steal); FORD adds its stop-the-world
//! stray-lock scan, during which [`SimRecovery::paused`] asks the survivors not to start
//! transactions (the paper's baseline stops the KVS, §6.1).
//!
//! Across the processes of a real cluster the same manager runs on the detector CN behind
//! `dmem-deploy`'s [`ProcessRecovery`] (link termination through the MN processes, MN
//! failures watched, control messages re-sent), and every CN runs Pandora's heartbeats and
//! CN listener ([`ProcessDeployment::process_tasks`]). A CN process on several cores (one
//! deployment per core, [`ProcessDeployment::join_core`]) runs the listener on its first core,
//! which forwards every control message to the other cores' followers
//! ([`ProcessDeployment::core_tasks`]) and acknowledges an MN view only once every core can
//! (`dmem-ford`'s `cores` module: why that keeps §3.2.2/§3.2.5's guarantees).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use dmem_deploy::process::{
    CnContexts, CoreGroup, LocalTask, MessageLinkTerminator, MnFailure, ProcessPlan,
    ProcessRecovery, ServiceContext, StepFuture,
};
use dmem_deploy::{
    AnyContext, Decision, DeployError, DeploySpec, Deployment, LateCoordinators, MnMemory,
    Placement, ProcessDeployment, Protocol, Recorder, RecoveredCoordinator, RecoveryEvent,
    RecoveryTiming, SimLinkTerminator, SimRecovery, restart_crashed_cn, restore_links,
};
use dmem_ford::cores::{CoreFollower, CoreRelay};
use dmem_ford::logic::Decision as FordDecision;
use dmem_ford::mnfail::{ListenerTiming, cn_listener_with_cores, core_follower};
use dmem_ford::recovery::{MnFailureEvent, heartbeat_loop, membership_listener};
use dmem_ford::{
    CnShared, FordCoordinator, FordTxn, LinkTerminator, Member, ProtocolConfig, RecoveryManager,
};
use dmem_layout::pill::{CoordinatorId as PillId, FailedCoordinatorSet, LockHolder, PillLockWord};
use dmem_layout::record::DataItem;
use dmem_sim::Sim;
use dmem_store::{BUCKET_SLOTS, LoadIndex, Loader, Store, StoreConfig, parse_bucket};
use dmem_txn::{BoxCoordinator, Coordinator, Key, TableId, TxnError, TxnKind};
use dmem_verbs::{Clock, Nanos, NodeId, Verbs, VerbsError};

/// FORD or Pandora under a registered name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FordProtocol {
    name: String,
    config: ProtocolConfig,
    /// CN restart (Pandora §6.3, Fig. 8's second line): a crashed CN's coordinators are
    /// brought back this many ns after the failure was detected, once it is recovered.
    restart_after: Option<Nanos>,
}

/// `params` of a `ford:`/`pandora:` name without its `restart=US` switch, and that switch
/// in ns.
///
/// # Errors
/// A message naming a malformed `restart=` value.
pub(crate) fn split_restart(params: &str) -> Result<(Vec<&str>, Option<Nanos>), String> {
    let mut rest = Vec::new();
    let mut restart = None;
    for p in params.split('+') {
        match p.strip_prefix("restart=") {
            Some(us) => {
                let us: u64 = us.parse().map_err(|_| {
                    format!("restart={us}: give the µs after detection a crashed CN comes back, e.g. restart=1000")
                })?;
                restart = Some(us.saturating_mul(1_000));
            }
            None => rest.push(p),
        }
    }
    Ok((rest, restart))
}

/// Restarts a coordinator may go through in one run (`dmem recover --crash-again-at-ms`
/// crashes a restarted CN once more): each incarnation takes fresh coordinator ids, so the
/// store keeps `1 + MAX_RESTARTS` log regions per coordinator the run starts.
const MAX_RESTARTS: u16 = 2;

impl FordProtocol {
    /// `config` registered as `name`.
    #[must_use]
    pub fn new(name: &str, config: ProtocolConfig) -> Self {
        Self {
            name: name.to_owned(),
            config,
            restart_after: None,
        }
    }

    /// The same protocol, registered as `name`, whose crashed CNs come back `after` ns
    /// after their failure was detected (Pandora §6.3: "the failed coordinators are brought
    /// back"), with new coordinator ids (§3.1.2: the failure detector hands out a fresh id
    /// to every coordinator it spawns; the old ids stay failed, so their stray locks stay
    /// stealable).
    #[must_use]
    pub fn restarting(mut self, name: &str, after: Nanos) -> Self {
        self.name = name.to_owned();
        self.restart_after = Some(after);
        self
    }

    /// The protocol configuration (protocol and bug switches).
    #[must_use]
    pub fn config(&self) -> ProtocolConfig {
        self.config
    }

    /// The store layout of `spec` on `mns` MNs, as [`Protocol::deploy`] lays it out (for
    /// deployments outside the simulator, which must agree on it in every process).
    #[must_use]
    pub fn store_config(&self, spec: &DeploySpec, mns: u16) -> StoreConfig {
        let config = store_config(spec, mns, self.config.lock_logging);
        match self.restart_after {
            // Log regions for the restarted incarnations' fresh ids.
            Some(_) => {
                let coordinators = spec.coordinators.saturating_mul(1 + MAX_RESTARTS);
                config.coordinators(coordinators)
            }
            None => config,
        }
    }
}

/// The layout of `spec` on `mns` MNs, each coordinator's log region sized for the
/// workload's largest write set in FORD's undo-log format (plus the lock log's tail with
/// `lock_logging`), never below the spec's floor.
fn store_config(spec: &DeploySpec, mns: u16, lock_logging: bool) -> StoreConfig {
    let layout = if spec.exact_index {
        StoreConfig::for_exact_tables
    } else {
        StoreConfig::for_tables
    };
    // FORD and Pandora follow the address in an index slot, so sparse tables keep their
    // records in a pool apart from the slots, and so do hashed tables (TPC-C's), except in
    // the litmus tests' exact layout, whose seeded runs keep the slot-fixed records.
    layout(
        mns,
        &spec.tables,
        spec.coordinators,
        spec.log_region_for(
            dmem_ford::wire::log_fixed_bytes(lock_logging),
            dmem_ford::wire::undo_record_bytes,
        ),
        spec.index_slack,
    )
    .with_pools(
        &spec.tables,
        spec.direct_tables(),
        spec.index_slack,
        !spec.exact_index,
    )
}

impl Protocol for FordProtocol {
    fn name(&self) -> String {
        self.name.clone()
    }

    /// `pandora:restart=US`, `ford:restart=US`, `ford:BUGS+restart=US` (§6.3); the other
    /// names (`occ`, `pandora-lock-logging`) have no restart switch.
    fn restarting_name(&self, after_us: u64) -> Option<String> {
        match self.name.as_str() {
            "pandora" | "ford" => Some(format!("{}:restart={after_us}", self.name)),
            n if n.starts_with("ford:") => Some(format!("{n}+restart={after_us}")),
            _ => None,
        }
    }

    fn mn_bytes_per_mn(&self, spec: &DeploySpec, mns: u16) -> Result<u64, DeployError> {
        Ok(self.store_config(spec, mns).bytes_per_mn()?)
    }

    /// The loader's [`dmem_store::LoadIndex`] entry of a hashed key (24 bytes in a map at
    /// most half full after growth, shared by every CN's warm cache) and the cache entries
    /// of keys a run inserts. TPC-C at 8 warehouses (4.41M records) peaks at 9.37 GB of RSS
    /// with about 9.5 GB of MN index and loaded records resident at most, so its CN side is
    /// a few hundred MB at most; 256 bytes per record (1.1 GB) is a margin over it
    /// (`dmem-store` README, "Hashed tables pooled").
    fn cn_bytes_per_hashed_record(&self) -> Option<u64> {
        Some(256)
    }

    fn deploy_on(
        &self,
        memory: MnMemory,
        spec: &DeploySpec,
        history: Recorder,
    ) -> Result<Box<dyn Deployment>, DeployError> {
        Ok(Box::new(self.deployment(memory, spec, history, None)?))
    }

    /// Takes the records as the loader of another deployment placed them (its
    /// [`Deployment::placement`]: the loader's [`LoadIndex`]), shared read-only: a warm
    /// address cache answers from it, and this deployment loads nothing itself.
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

impl FordProtocol {
    /// A deployment on `memory`, its records placed by the loader of another one if
    /// `placed` (else by its own, record by record).
    fn deployment(
        &self,
        memory: MnMemory,
        spec: &DeploySpec,
        history: Recorder,
        placed: Option<Arc<LoadIndex>>,
    ) -> Result<FordDeployment, DeployError> {
        let mns = memory.mn_count();
        let store = Rc::new(Store::new(self.store_config(spec, mns), memory.regions())?);
        Ok(FordDeployment {
            name: self.name.clone(),
            config: self.config,
            memory,
            loader: Loader::shared(Rc::clone(&store)),
            placed,
            store,
            history,
            cns: Vec::new(),
            warm: spec.warm_cache,
            events: Rc::new(RefCell::new(Vec::new())),
            error: Rc::new(RefCell::new(None)),
            paused: Rc::new(Cell::new(false)),
            steals: Rc::new(Cell::new(0)),
            core: CoreSide::Alone,
            clock: None,
            restart: Restart {
                after: self.restart_after,
                first_spare: spec.coordinators,
                threads: Vec::new(),
                runner: Rc::default(),
                cns: Rc::default(),
                coordinators: Rc::default(),
                serving_at: Rc::default(),
            },
        })
    }
}

/// FORD/Pandora on one cluster. [`ford_view`] reaches it through a [`Deployment`], for a
/// test that drives `dmem-ford`'s recovery pieces itself; commands use the neutral
/// [`ProcessDeployment::process_tasks`] and [`ProcessDeployment::process_recovery`].
pub struct FordDeployment {
    name: String,
    config: ProtocolConfig,
    memory: MnMemory,
    store: Rc<Store>,
    loader: Loader<'static>,
    /// The records as another deployment's loader placed them ([`Protocol::deploy_placed`]:
    /// the cores of a CN process share one dry load); `loader` then loads nothing.
    placed: Option<Arc<LoadIndex>>,
    history: Recorder,
    /// Per CN: its shared state and its coordinator ids.
    cns: Vec<(NodeId, CnShared, Vec<u16>)>,
    /// Whether CNs start with a warm address cache (answered from the loader's shared
    /// [`dmem_store::LoadIndex`], not a copy per CN).
    warm: bool,
    events: Rc<RefCell<Vec<dmem_ford::RecoveryEvent>>>,
    error: Rc<RefCell<Option<String>>>,
    paused: Rc<Cell<bool>>,
    steals: Rc<Cell<u64>>,
    /// Its place among the cores of a CN process ([`ProcessDeployment::join_core`]).
    core: CoreSide,
    /// The context of the first coordinator made here: the clock of a [`core_follower`].
    clock: Option<AnyContext>,
    restart: Restart,
}

/// CN restart in the simulator (Pandora §6.3): what the deployment knows to bring a
/// recovered CN's coordinators back.
struct Restart {
    /// After how long (from detection) a crashed CN comes back; `None`: it does not.
    after: Option<Nanos>,
    /// The first coordinator id no coordinator of the run's start has: restarted
    /// incarnations take ids from here on.
    first_spare: u16,
    /// The simulator thread each coordinator runs on: its restarted successor runs there.
    threads: Vec<(u16, u16)>,
    /// Where restarted coordinators go ([`SimRecovery::run_late_coordinators`]).
    runner: Rc<RefCell<Option<LateCoordinators>>>,
    /// CN restarts done, coordinators restarted, and when the last restarted CN's
    /// coordinators started.
    cns: Rc<Cell<u64>>,
    coordinators: Rc<Cell<u64>>,
    serving_at: Rc<Cell<Option<Nanos>>>,
}

/// A deployment's place among the cores of a CN process: the CN listener's control messages
/// (stray-lock notifications, MN views, resumes) reach every core's coordinators through a
/// [`CoreRelay`] (`dmem-ford`'s `cores` module says why that keeps Pandora's guarantees).
enum CoreSide {
    /// The only core (the simulator, or a process of one core).
    Alone,
    /// The first core: its listener forwards to the others.
    First(Arc<CoreRelay>),
    /// Another core: its end of the relay, until [`ProcessDeployment::core_tasks`] takes it.
    Other(Option<CoreFollower>),
}

/// [`SimLinkTerminator`] as `dmem-ford`'s terminator (a local newtype: both the trait and
/// the type are foreign here).
struct Terminator(SimLinkTerminator);

impl LinkTerminator for Terminator {
    async fn terminate(&self, mn: NodeId, cn: NodeId) -> Result<(), VerbsError> {
        self.0.terminate(mn, cn);
        Ok(())
    }
}

/// [`MessageLinkTerminator`] (link termination through MN processes) as `dmem-ford`'s
/// terminator.
struct Remote(MessageLinkTerminator);

impl LinkTerminator for Remote {
    async fn terminate(&self, mn: NodeId, cn: NodeId) -> Result<(), VerbsError> {
        self.0.terminate(mn, cn).await
    }
}

/// Pandora's failure detector and recovery manager (§3.2.2, §3.2.5) on the detector CN of
/// a real cluster, behind the fabric-neutral [`ProcessRecovery`].
struct FordProcessRecovery {
    name: String,
    manager: RecoveryManager<AnyContext, Remote>,
    members: Vec<Member>,
    /// The detector's view (a fork of the store, see [`RecoveryManager::watch_mns`]).
    store: Rc<Store>,
    events: Rc<RefCell<Vec<dmem_ford::RecoveryEvent>>>,
    mn_events: Rc<RefCell<Vec<MnFailureEvent>>>,
}

impl FordProcessRecovery {
    fn error(&self, e: impl ToString) -> DeployError {
        DeployError::Protocol {
            protocol: self.name.clone(),
            reason: e.to_string(),
        }
    }
}

impl ProcessRecovery for FordProcessRecovery {
    fn detect(&mut self) -> Result<Vec<NodeId>, DeployError> {
        match self.manager.detect() {
            Ok(suspects) => Ok(suspects.into_iter().map(|m| m.cn).collect()),
            Err(e) => Err(self.error(e)),
        }
    }

    fn recover(&mut self, cn: NodeId) -> StepFuture<'_, ()> {
        Box::pin(async move {
            let Some(member) = self.members.iter().find(|m| m.cn == cn).cloned() else {
                return Err(self.error(format!("node {} is no CN of the cluster", cn.0)));
            };
            let r = self.manager.recover_member(member).await;
            r.map_err(|e| self.error(format!("recovering node {}: {e}", cn.0)))
        })
    }

    fn watch_mns(&mut self) -> StepFuture<'_, ()> {
        Box::pin(async move {
            let mut r = self.manager.check_mns().await;
            if r.is_ok() {
                r = self.manager.maybe_resume().await;
            }
            r.map_err(|e| self.error(e))
        })
    }

    fn events(&self) -> Vec<RecoveryEvent> {
        neutral_events(&self.events.borrow())
    }

    fn mn_failures(&self) -> Vec<MnFailure> {
        self.mn_events
            .borrow()
            .iter()
            .map(|e| MnFailure {
                mn: self.store.mn_node(e.mn),
                detected_at: e.detected_at,
                resumed_at: e.resumed_at,
            })
            .collect()
    }
}

/// How often a CN's listener (and every other core's follower) looks for control messages:
/// four times a heartbeat period.
fn listener_poll(heartbeat: Nanos) -> Nanos {
    (heartbeat / 4).max(1)
}

/// `dmem-ford`'s recovery events in the protocol-neutral form.
fn neutral_events(events: &[dmem_ford::RecoveryEvent]) -> Vec<RecoveryEvent> {
    let decision = |d: FordDecision| match d {
        FordDecision::RollForward => Decision::RollForward,
        FordDecision::RollBack => Decision::RollBack,
    };
    events
        .iter()
        .map(|e| RecoveryEvent {
            cn: e.cn,
            detected_at: e.detected_at,
            terminated_at: e.terminated_at,
            logs_recovered_at: e.logs_recovered_at,
            finished_at: e.notified_at,
            coordinators: e
                .coordinators
                .iter()
                .map(|c| RecoveredCoordinator {
                    coordinator: c.coordinator,
                    txn: c.txn,
                    decision: c.decision.map(decision),
                    restored: c.restored,
                    unlocked: c.unlocked,
                })
                .collect(),
            scanned_locks: e.scanned_locks,
        })
        .collect()
}

/// A FORD coordinator that adds its PILL steals to the deployment's count when it is
/// dropped (its task ended), so that `dmem recover` can report them through the neutral
/// [`Deployment::counter`].
struct Counted {
    inner: FordCoordinator<AnyContext, Recorder>,
    steals: Rc<Cell<u64>>,
}

impl Coordinator for Counted {
    type Txn<'a> = FordTxn<'a, AnyContext, Recorder>;

    async fn begin(&mut self, kind: TxnKind) -> Result<Self::Txn<'_>, TxnError> {
        self.inner.begin(kind).await
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.steals
            .set(self.steals.get() + self.inner.stats().steals);
    }
}

/// The FORD/Pandora deployment behind `deployment`, if it is one.
#[must_use]
pub fn ford_view(deployment: &dyn Deployment) -> Option<&FordDeployment> {
    deployment.as_any().downcast_ref()
}

impl core::fmt::Debug for FordDeployment {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("FordDeployment")
            .field("name", &self.name)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl FordDeployment {
    /// The store.
    #[must_use]
    pub fn store(&self) -> &Rc<Store> {
        &self.store
    }

    /// The protocol configuration.
    #[must_use]
    pub fn config(&self) -> ProtocolConfig {
        self.config
    }

    /// The state shared by the coordinators made on CN `cn` (its address cache and the
    /// coordinators it knows failed), if any were made there.
    #[must_use]
    pub fn cn_shared(&self, cn: NodeId) -> Option<CnShared> {
        self.cns
            .iter()
            .find(|(n, _, _)| *n == cn)
            .map(|(_, s, _)| s.clone())
    }

    fn shared_of(&mut self, cn: NodeId) -> usize {
        if let Some(i) = self.cns.iter().position(|(n, _, _)| *n == cn) {
            return i;
        }
        let shared = CnShared::new();
        if self.warm {
            let mut cache = shared.cache.borrow_mut();
            match &self.placed {
                Some(placed) => cache.warm_from_placed(Rc::clone(&self.store), Arc::clone(placed)),
                None => cache.warm_from(Rc::clone(&self.store), self.loader.loaded()),
            }
        }
        self.cns.push((cn, shared, Vec::new()));
        self.cns.len() - 1
    }

    fn make(
        &self,
        ctx: AnyContext,
        id: u16,
        shared: CnShared,
    ) -> Result<BoxCoordinator, DeployError> {
        Ok(Box::new(self.maker().make(ctx, id, shared)?))
    }

    fn maker(&self) -> CoordinatorMaker {
        CoordinatorMaker {
            store: Rc::clone(&self.store),
            config: self.config,
            history: self.history.clone(),
            steals: Rc::clone(&self.steals),
            warm: (self.warm && self.placed.is_none()).then(|| self.loader.loaded()),
        }
    }

    fn failed(&self) -> FailedCoordinatorSet {
        let mut failed = FailedCoordinatorSet::EMPTY;
        for ev in self.events.borrow().iter() {
            for c in &ev.coordinators {
                failed.insert(PillId(c.coordinator));
            }
        }
        failed
    }

    fn protocol_error(&self, reason: impl ToString) -> DeployError {
        DeployError::Protocol {
            protocol: self.name.clone(),
            reason: reason.to_string(),
        }
    }
}

/// What makes a FORD/Pandora coordinator, apart from the deployment (a restart makes
/// coordinators from a simulated task, long after the deployment handed them out).
#[derive(Clone)]
struct CoordinatorMaker {
    store: Rc<Store>,
    config: ProtocolConfig,
    history: Recorder,
    steals: Rc<Cell<u64>>,
    /// The loader's index, when CNs start with a warm address cache.
    warm: Option<Rc<RefCell<LoadIndex>>>,
}

impl CoordinatorMaker {
    fn make(&self, ctx: AnyContext, id: u16, shared: CnShared) -> Result<Counted, DeployError> {
        let inner = FordCoordinator::new(
            ctx,
            Rc::clone(&self.store),
            self.config,
            id,
            shared,
            self.history.clone(),
        )?;
        Ok(Counted {
            inner,
            steals: Rc::clone(&self.steals),
        })
    }

    /// A CN's shared state as a new process starts with it: its address cache warm if the
    /// run's CNs start warm, and the coordinators known failed.
    fn fresh_cn(&self, failed: FailedCoordinatorSet) -> CnShared {
        let shared = CnShared::new();
        *shared.failed.borrow_mut() = failed;
        if let Some(loaded) = &self.warm {
            shared
                .cache
                .borrow_mut()
                .warm_from(Rc::clone(&self.store), Rc::clone(loaded));
        }
        shared
    }
}

/// Starts CN `node`'s member tasks in the simulator (Pandora §3.2.2) beside its
/// coordinators, on its thread 1 (thread 0 if it has one): the heartbeat to `detector` and
/// the stray-lock listener that keeps `failed` current. Returns the listener's endpoint.
fn spawn_member_tasks(
    sim: &Sim,
    node: NodeId,
    detector: dmem_verbs::Endpoint,
    timing: RecoveryTiming,
    failed: Rc<RefCell<FailedCoordinatorSet>>,
) -> Result<dmem_verbs::Endpoint, DeployError> {
    let thread_ctx = || sim.context(node, 1).or_else(|_| sim.context(node, 0));
    let listener = thread_ctx()?;
    let hb = thread_ctx()?;
    let h = hb.clone();
    sim.spawn(&hb, async move {
        let _ = heartbeat_loop(&h, detector, timing.heartbeat, timing.until).await;
    });
    let l = listener.clone();
    sim.spawn(&listener, async move {
        let _ = membership_listener(&l, failed, timing.poll, timing.until).await;
    });
    Ok(listener.local_endpoint())
}

/// Pandora §6.3's restart of recovered CNs in the simulator ("the failed coordinators are
/// brought back", Fig. 8's second line): a recovered CN comes back `after` its failure was
/// detected, with one coordinator on the same thread for each it lost, under new ids from
/// the failure detector's counter (§3.1.2), the failed-ids as its initial configuration,
/// and its heartbeat and stray-lock listener running; it then joins the detector's members.
struct Respawn {
    sim: Rc<Sim>,
    maker: CoordinatorMaker,
    after: Nanos,
    timing: RecoveryTiming,
    detector: dmem_verbs::Endpoint,
    threads: Vec<(u16, u16)>,
    /// The failure detector's coordinator-id counter.
    next_id: Cell<u16>,
    /// Restarted CNs for the detector to add to its members.
    joining: Rc<RefCell<Vec<Member>>>,
    runner: Rc<RefCell<Option<LateCoordinators>>>,
    cns: Rc<Cell<u64>>,
    coordinators: Rc<Cell<u64>>,
    serving_at: Rc<Cell<Option<Nanos>>>,
    error: Rc<RefCell<Option<String>>>,
}

impl Respawn {
    /// Restarts `member`, recovered from a failure detected at `detected_at`, as a task of
    /// its own on `clock`'s node.
    fn spawn(
        self: Rc<Self>,
        clock: &dmem_sim::SimContext,
        member: Member,
        detected_at: Nanos,
        failed: FailedCoordinatorSet,
    ) {
        let c = clock.clone();
        self.sim.clone().spawn(clock, async move {
            let delay = (detected_at + self.after).saturating_sub(c.now());
            if let Err(e) = self.restart(&c, &member, delay, failed).await {
                self.error.borrow_mut().get_or_insert(e);
            }
        });
    }

    async fn restart(
        &self,
        clock: &dmem_sim::SimContext,
        member: &Member,
        delay: Nanos,
        failed: FailedCoordinatorSet,
    ) -> Result<(), String> {
        let (sim, node) = (&self.sim, member.cn);
        restart_crashed_cn(sim, clock, node, delay, self.timing.poll).await?;
        restore_links(sim, node);
        let shared = self.maker.fresh_cn(failed);
        let mut late = Vec::new();
        let mut ids = Vec::new();
        for &old in &member.coordinators {
            let id = self.next_id.get();
            if id >= self.maker.store.config().coordinators {
                return Err(format!(
                    "no log region left for coordinator {old}'s restart (the store keeps {MAX_RESTARTS} restarts per coordinator)"
                ));
            }
            self.next_id.set(id + 1);
            let thread = self
                .threads
                .iter()
                .find(|(c, _)| *c == old)
                .map_or(0, |&(_, t)| t);
            let ctx = sim.context(node, thread).map_err(|e| e.to_string())?;
            let co = self
                .maker
                .make(ctx.clone().into(), id, shared.clone())
                .map_err(|e| e.to_string())?;
            ids.push(id);
            late.push((ctx, id, co));
        }
        let listener = spawn_member_tasks(
            sim,
            node,
            self.detector,
            self.timing,
            Rc::clone(&shared.failed),
        )
        .map_err(|e| e.to_string())?;
        self.joining.borrow_mut().push(Member {
            cn: node,
            coordinators: ids,
            listener,
        });
        self.cns.set(self.cns.get() + 1);
        self.coordinators
            .set(self.coordinators.get() + late.len() as u64);
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

impl Deployment for FordDeployment {
    /// The loader's index of the records loaded so far (or the placement it was given).
    fn placement(&self) -> Option<Placement> {
        Some(match &self.placed {
            Some(placed) => Arc::clone(placed) as Placement,
            None => Arc::new(self.loader.loaded().borrow().clone()),
        })
    }

    fn load(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), DeployError> {
        if self.placed.is_some() {
            return Err(crate::common::load_on_placed(&self.name));
        }
        let loader = &mut self.loader;
        self.memory
            .loading(|write| loader.load(table, key, value, write))?;
        Ok(())
    }

    fn coordinator(&mut self, ctx: AnyContext, id: u16) -> Result<BoxCoordinator, DeployError> {
        if let Some(sim) = ctx.as_sim() {
            self.restart.threads.push((id, sim.thread()));
        }
        let i = self.shared_of(ctx.node());
        self.cns[i].2.push(id);
        let shared = self.cns[i].1.clone();
        if self.clock.is_none() {
            self.clock = Some(ctx.clone());
        }
        self.make(ctx, id, shared)
    }

    fn replicas(&self) -> u16 {
        self.store.config().replicas
    }

    fn final_coordinator(
        &mut self,
        ctx: AnyContext,
        id: u16,
    ) -> Result<BoxCoordinator, DeployError> {
        let shared = CnShared::new();
        *shared.failed.borrow_mut() = self.failed();
        self.make(ctx, id, shared)
            .map_err(|e| self.protocol_error(format!("final coordinator {id}: {e}")))
    }

    fn read_final(&self, table: TableId, key: Key) -> Option<Vec<u8>> {
        read_record_past_stray(&self.memory, &self.store, table, key, &self.failed())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn counter(&self, name: &str) -> Option<u64> {
        match name {
            "steals" => Some(self.steals.get()),
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

impl SimRecovery for FordDeployment {
    fn start_recovery(
        &mut self,
        sim: &Rc<Sim>,
        recovery_cn: u16,
        timing: RecoveryTiming,
    ) -> Result<(), DeployError> {
        let fd_ctx = sim.context(sim.cn(recovery_cn), 0)?;
        let detector = fd_ctx.local_endpoint();
        let mut members = Vec::new();
        for (cn, shared, ids) in &self.cns {
            let listener =
                spawn_member_tasks(sim, *cn, detector, timing, Rc::clone(&shared.failed))?;
            members.push(Member {
                cn: *cn,
                coordinators: ids.clone(),
                listener,
            });
        }
        let mut manager = RecoveryManager::new(
            fd_ctx.clone(),
            Rc::clone(&self.store),
            self.config.protocol,
            Terminator(SimLinkTerminator(Rc::clone(sim))),
            members,
            timing.timeout,
        );
        self.events = manager.events();
        let stop_the_world = self.config.protocol == dmem_ford::Protocol::Ford;
        let (paused, error) = (Rc::clone(&self.paused), Rc::clone(&self.error));
        let respawn = self.restart.after.map(|after| {
            Rc::new(Respawn {
                sim: Rc::clone(sim),
                maker: self.maker(),
                after,
                timing,
                detector,
                threads: self.restart.threads.clone(),
                next_id: Cell::new(self.restart.first_spare),
                joining: Rc::default(),
                runner: Rc::clone(&self.restart.runner),
                cns: Rc::clone(&self.restart.cns),
                coordinators: Rc::clone(&self.restart.coordinators),
                serving_at: Rc::clone(&self.restart.serving_at),
                error: Rc::clone(&self.error),
            })
        });
        let clock = fd_ctx.clone();
        sim.spawn(&fd_ctx, async move {
            // `RecoveryManager::run`, with FORD's stop-the-world pause around its recovery
            // and the restarted CNs joining.
            let r: Result<(), dmem_ford::RecoveryError> = async {
                while clock.now() < timing.until {
                    if let Some(respawn) = &respawn {
                        let joining: Vec<Member> = respawn.joining.borrow_mut().drain(..).collect();
                        for member in joining {
                            manager.join(member).await?;
                        }
                    }
                    let suspects = manager.detect()?;
                    manager.check_mns().await?;
                    if stop_the_world && !suspects.is_empty() {
                        paused.set(true);
                    }
                    for member in suspects {
                        let detected_at = clock.now();
                        manager.recover(member.clone()).await?;
                        if let Some(respawn) = &respawn {
                            let failed = manager.failed().clone();
                            Rc::clone(respawn).spawn(&clock, member, detected_at, failed);
                        }
                    }
                    paused.set(false);
                    clock.sleep(timing.poll).await;
                }
                Ok(())
            }
            .await;
            // A failed recovery step leaves the run to the assertion and the checker; the
            // error is reported through `recovery_error`.
            if let Err(e) = r {
                paused.set(false);
                *error.borrow_mut() = Some(e.to_string());
            }
        });
        Ok(())
    }

    fn run_late_coordinators(&self, run: LateCoordinators) {
        *self.restart.runner.borrow_mut() = Some(run);
    }

    fn recovery_events(&self) -> Vec<RecoveryEvent> {
        neutral_events(&self.events.borrow())
    }

    fn recovery_error(&self) -> Option<String> {
        self.error.borrow().clone()
    }

    fn paused(&self) -> Rc<Cell<bool>> {
        Rc::clone(&self.paused)
    }

    fn scan_cost(&self) -> Option<(u64, u64)> {
        let mns = u64::from(self.store.config().mns);
        Some(
            self.store
                .config()
                .tables
                .iter()
                .filter_map(|t| self.store.table(t.id).ok())
                .fold((0, 0), |(reads, bytes), l| {
                    // `scan_stray_locks` READs every record of a partition, seven at a time.
                    let records = l.records_per_partition * mns;
                    (
                        reads + records.div_ceil(BUCKET_SLOTS as u64),
                        bytes + records * l.item_len as u64,
                    )
                }),
        )
    }
}

impl ProcessDeployment for FordDeployment {
    fn recovers_across_processes(&self) -> bool {
        true
    }

    fn process_tasks(
        &mut self,
        me: NodeId,
        ctxs: CnContexts,
        plan: &ProcessPlan,
    ) -> Result<Vec<LocalTask>, DeployError> {
        let (detector, period) = (plan.detector, plan.heartbeat);
        let hb = ctxs.heartbeat;
        let mut tasks: Vec<LocalTask> = vec![Box::pin(async move {
            // A send fails while the detector's CN is still starting (nothing listens
            // yet): heartbeat again after a period rather than stop for good.
            while heartbeat_loop(&hb, detector, period, u64::MAX)
                .await
                .is_err()
            {
                hb.sleep(period).await;
            }
        })];
        if let Some(shared) = self.cn_shared(me) {
            // Pandora's CN side: stray-lock notifications and MN failures (§3.2.5: the view
            // change into this CN's store, the pause, the acknowledgement, the resume).
            // On a CN process of several cores, forwarded to the others too.
            let relay = match &self.core {
                CoreSide::First(relay) => Arc::clone(relay),
                CoreSide::Alone | CoreSide::Other(_) => Arc::new(CoreRelay::new(1)),
            };
            let (store, listener) = (Rc::clone(&self.store), ctxs.listener);
            let timing = ListenerTiming {
                poll: listener_poll(period),
                resend: Some(period),
                until: u64::MAX,
            };
            tasks.push(Box::pin(async move {
                let _ = cn_listener_with_cores(&listener, store, shared, &relay, detector, timing)
                    .await;
            }));
        }
        Ok(tasks)
    }

    fn process_recovery(
        &mut self,
        ctx: AnyContext,
        terminator: MessageLinkTerminator,
        plan: &ProcessPlan,
    ) -> Result<Option<Box<dyn ProcessRecovery>>, DeployError> {
        let members: Vec<Member> = plan
            .members
            .iter()
            .map(|m| Member {
                cn: m.cn,
                coordinators: m.coordinators.clone(),
                listener: m.listener,
            })
            .collect();
        // The detector's own view of the MNs (a fork: this CN's coordinators learn of an
        // MN failure through their listener, like every other CN's).
        let store = Rc::new(self.store.fork_view());
        let manager = RecoveryManager::new(
            ctx,
            Rc::clone(&store),
            self.config.protocol,
            Remote(terminator),
            members.clone(),
            plan.timeout,
        )
        .watch_mns(plan.heartbeat)
        .resend_control(plan.heartbeat, plan.answer_timeout);
        // The final coordinator learns the failed coordinators from these events.
        self.events = manager.events();
        Ok(Some(Box::new(FordProcessRecovery {
            name: self.name.clone(),
            events: manager.events(),
            mn_events: manager.mn_events(),
            manager,
            members,
            store,
        })))
    }

    /// Split: the first core's CN listener (Pandora §3.2.2, §3.2.5) forwards every control
    /// message to the other cores' [`core_tasks`](ProcessDeployment::core_tasks), and acknowledges
    /// an MN view only once every core can (`dmem-ford`'s `cores`).
    fn splits_across_cores(&self) -> Result<(), String> {
        Ok(())
    }

    fn join_core(&mut self, group: CoreGroup) -> Result<(), DeployError> {
        let cores = group.cores();
        let Some(relay) = group.shared(|| CoreRelay::new(cores)) else {
            return Err(self.protocol_error("the cores of this CN share another protocol's state"));
        };
        self.core = match group.core() {
            0 => CoreSide::First(relay),
            core => match relay.follower(core) {
                Some(follower) => CoreSide::Other(Some(follower)),
                None => {
                    return Err(self.protocol_error(format!("core {core} joined its CN twice")));
                }
            },
        };
        Ok(())
    }

    fn core_tasks(
        &mut self,
        me: NodeId,
        plan: &ProcessPlan,
        _services: Vec<ServiceContext>,
    ) -> Result<Vec<LocalTask>, DeployError> {
        let CoreSide::Other(follower) = &mut self.core else {
            return Ok(Vec::new());
        };
        let follower = follower.take();
        // A core without coordinators drops its follower here: it retires at once.
        let (Some(follower), Some(shared), Some(clock)) =
            (follower, self.cn_shared(me), self.clock.clone())
        else {
            return Ok(Vec::new());
        };
        let task = core_follower(
            clock,
            Rc::clone(&self.store),
            shared,
            follower,
            plan.detector,
            listener_poll(plan.heartbeat),
            u64::MAX,
        );
        Ok(vec![Box::pin(task)])
    }

    fn failed_mns(&self) -> Vec<NodeId> {
        let view = self.store.view().borrow();
        (0..self.store.config().mns)
            .filter(|&mn| !view.is_alive(mn))
            .map(|mn| self.store.mn_node(mn))
            .collect()
    }
}

/// Reads the committed value of `(table, key)` from its primary's memory (outside virtual
/// time), reading through a lock held by one of `failed`: a stray lock that PILL lets
/// readers ignore and writers steal (Pandora §3.1.2), left by a crashed coordinator's
/// not-logged transaction.
fn read_record_past_stray(
    memory: &MnMemory,
    store: &Store,
    table: TableId,
    key: Key,
    failed: &FailedCoordinatorSet,
) -> Option<Vec<u8>> {
    let bucket = store.bucket_of(table, key).ok()?;
    let primary = store.primary(bucket.partition).ok()?;
    let node = store.mn_node(primary);
    let bytes = memory.read(node, bucket.offset, bucket.read_len() as usize)?;
    let (used, _) = parse_bucket(&bytes);
    let slot = used.iter().find(|(_, k)| *k == key.0)?.0;
    let loc = store.item_in_bucket(bucket, slot, &bytes).ok()?;
    let layout = store.table(table).ok()?;
    let item_bytes = memory.read(node, loc.offset, layout.item_len)?;
    let item = DataItem::new_checked(&item_bytes[..]).ok()?;
    let header = item.header();
    let stray = matches!(
        PillLockWord::from_raw(header.lock_word()).holder(failed),
        Ok(LockHolder::Stray(_))
    );
    let readable = item.is_readable()
        || (stray && header.flags().is_valid() && !header.version().is_invisible());
    readable.then(|| item.value().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_restart_switch_is_taken_out_of_the_bug_list() {
        assert_eq!(
            split_restart("covert-locks+restart=250+lost-decision"),
            Ok((vec!["covert-locks", "lost-decision"], Some(250_000)))
        );
        assert_eq!(
            split_restart("covert-locks"),
            Ok((vec!["covert-locks"], None))
        );
        assert!(split_restart("restart=soon").is_err());
    }

    #[test]
    fn a_restarting_store_keeps_log_regions_for_the_new_incarnations() {
        let spec = DeploySpec::new(Vec::new(), 8);
        let plain = FordProtocol::new("pandora", ProtocolConfig::pandora());
        let restarting = plain.clone().restarting("pandora:restart=1", 1_000);
        assert_eq!(plain.store_config(&spec, 3).coordinators, 8);
        assert_eq!(
            restarting.store_config(&spec, 3).coordinators,
            8 * (1 + MAX_RESTARTS)
        );
    }
}

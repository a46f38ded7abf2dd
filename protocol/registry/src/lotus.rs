//! LOTUS (SR and SI) as a [`Protocol`] on the simulated cluster (here; in CN processes of
//! a real cluster: [`crate::lotus_process`]): Motor's MVCC store
//! (shared with [`crate::motor`] through `MvccDeploy`) plus a commit-log region per
//! coordinator, one lock table per CN, one lock server per CN thread, the shard map and
//! the hybrid router (LOTUS §4.3) the bench harness places transactions with.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use dmem_deploy::{
    AnyContext, Decision, DeployError, DeploySpec, Deployment, LateCoordinators, MnMemory,
    Placement, Protocol, Recorder, RecoveredCoordinator, RecoveryEvent, RecoveryTiming, Router,
    SimLinkTerminator, SimRecovery, restart_crashed_cn, restore_links,
};
use dmem_lotus::membership::notify;
use dmem_lotus::recovery::{Decided, recover_coordinators};
use dmem_lotus::reshard::{CnMetric, monitor};
use dmem_lotus::restart::{Action, Event, Phase, Restart};
use dmem_lotus::wire::RequestKind;
use dmem_lotus::{
    CnLocks, LockCluster, LotusConfig, LotusCoordinator, ReshardConfig, ShardMap, Sharding, serve,
};
use dmem_motor::SyncedClock;
use dmem_motor::mvcc::VersionLayout;
use dmem_sim::{Sim, SimContext};
use dmem_store::LoadIndex;
use dmem_txn::{BoxCoordinator, History, Key, TableId, TxnKind, TxnOutcome};
use dmem_verbs::Clock;

use crate::lotus_process::LotusProcessDeployment;
use crate::mvcc_deploy::{MvccDeploy, Records};

/// LOTUS under a registered name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LotusProtocol {
    name: String,
    /// Protocol switches.
    pub config: LotusConfig,
    /// Bytes of lock slots per CN (LOTUS §8.1: 32 MB).
    pub lock_table_bytes: usize,
    /// CPU a CN core spends per lock or unlock, ns (modelled, see the crate README).
    pub lock_cpu_ns: u64,
    /// Ablation (§8.3): shard every record by hash instead of its critical field.
    pub random_sharding: bool,
    /// Ablation (§8.3): no hybrid routing; transactions run where they were generated.
    pub no_routing: bool,
    /// Planted bug for the litmus suite: recovery releases a failed CN's locks before it
    /// decides the CN's transactions from their commit logs (LOTUS §6 orders them the
    /// other way).
    pub early_unlock: bool,
    /// Pass-by-range resharding (§4.3).
    pub reshard: ReshardConfig,
    /// CN restart (§6): a crashed CN comes back this many ns after its failure was
    /// detected (the process restart time, which the simulator does not model), with an
    /// empty lock table, and serves its shards again after its broadcast. `None`: it never
    /// comes back and its shards move to the survivors.
    pub restart_after: Option<u64>,
    /// Planted bug: the restarted CN serves as soon as it is up, before its old
    /// transactions are finished.
    pub restart_early: bool,
    /// Planted bug: a restarted CN's coordinators number their transactions from 1 again,
    /// as in its first incarnation (their ids, and their commit logs' writers, equal the
    /// old incarnation's).
    pub restart_same_ids: bool,
    /// Versions (CVT cells) per record; `None`: the workload's default
    /// (`dmem_motor::cells_for_workload`).
    pub versions: Option<usize>,
    /// The lock tables of the CN processes this value deployed in this process, shared by
    /// their cores' deployments (not part of the protocol's identity).
    pub(crate) tables: crate::lotus_process::ProcessTables,
}

/// CNs the metrics region of resharding has room for.
const METRICS_CNS: u16 = 1024;

impl LotusProtocol {
    /// Sparse tables' blocks pooled, unless CNs restart: a restarted CN's coordinators
    /// keep their ids (§6) and would need their insert shares' cursors recovered, which is
    /// not done, so with `restart=` every block stays in its slot.
    fn records(&self) -> Records {
        if self.restart_after.is_some() {
            Records::InSlots
        } else {
            Records::Pooled
        }
    }

    /// `config` registered as `name` with the paper's table size.
    #[must_use]
    pub fn new(name: &str, config: LotusConfig) -> Self {
        Self {
            name: name.to_owned(),
            config,
            lock_table_bytes: 32 << 20,
            lock_cpu_ns: 60,
            random_sharding: false,
            no_routing: false,
            early_unlock: false,
            reshard: ReshardConfig::default(),
            restart_after: None,
            restart_early: false,
            restart_same_ids: false,
            versions: None,
            tables: crate::lotus_process::ProcessTables::default(),
        }
    }

    /// `lotus:FLAG[+FLAG]`: `si`, `no-sharding`, `no-routing`, `no-vt-cache` (the §8.3
    /// ablation), `rdma-lock` (§8.4 Fig. 17's idealised RDMA lock),
    /// `early-unlock` (a planted recovery bug); resharding (§4.3, off unless asked for):
    /// `reshard` (the load monitor every 100 ms of virtual time), `reshard=US` (every US µs), `drain=US` (how long a
    /// hand-over waits for the shard's holders, default 10 ms), `overload=PCT` (a CN is
    /// overloaded above PCT % of the mean latency, default 150), and
    /// `reshard-no-drain` (a planted bug: hand over without draining or aborting holders);
    /// CN restart (§6): `restart=US` (a crashed CN restarts US µs after its failure is
    /// detected, 0 allowed), `restart-early` (a planted bug: the restarted CN serves before
    /// its old transactions are finished; implies `restart=0` unless given),
    /// `restart-same-ids` (a planted bug: the restarted CN's coordinators reuse the old
    /// incarnation's transaction ids; implies `restart=0` unless given); `versions=N` (N
    /// versions per record instead of the workload's default; §8 runs LOTUS and Motor
    /// with 2).
    ///
    /// # Errors
    /// The unknown flag, or a version count outside 1 ..= 8.
    pub fn with_flags(params: &str) -> Result<Self, String> {
        let mut p = Self::new(&format!("lotus:{params}"), LotusConfig::sr());
        for f in params.split(['+', ',']).filter(|f| !f.is_empty()) {
            match f {
                "si" => p.config.isolation = dmem_lotus::Isolation::Snapshot,
                "no-sharding" => p.random_sharding = true,
                "no-routing" => p.no_routing = true,
                "early-unlock" => p.early_unlock = true,
                "no-vt-cache" => p.config.vt_cache = false,
                "rdma-lock" => p.config.rdma_lock = true,
                "reshard" => p.reshard.enabled = true,
                "restart-same-ids" => {
                    p.restart_same_ids = true;
                    p.restart_after.get_or_insert(0);
                }
                "restart-early" => {
                    p.restart_early = true;
                    p.restart_after.get_or_insert(0);
                }
                "reshard-no-drain" => {
                    p.reshard.enabled = true;
                    p.reshard.drain = false;
                }
                other => {
                    let us = |v: &str| {
                        v.parse::<u64>()
                            .ok()
                            .filter(|&n| n > 0)
                            .map(|n| n.saturating_mul(1_000))
                            .ok_or_else(|| {
                                format!("lotus switch `{other}`: expected a positive number of µs")
                            })
                    };
                    if let Some(v) = other.strip_prefix("restart=") {
                        let us: u64 = v.parse().map_err(|_| {
                            format!("lotus switch `{other}`: expected a number of µs")
                        })?;
                        p.restart_after = Some(us.saturating_mul(1_000));
                    } else if let Some(v) = other.strip_prefix("reshard=") {
                        p.reshard.enabled = true;
                        p.reshard.interval = us(v)?;
                    } else if let Some(v) = other.strip_prefix("versions=") {
                        p.versions = Some(crate::mvcc_deploy::parse_versions("lotus", other, v)?);
                    } else if let Some(v) = other.strip_prefix("drain=") {
                        p.reshard.drain_timeout = us(v)?;
                    } else if let Some(v) = other.strip_prefix("overload=") {
                        p.reshard.overload_pct = v.parse().map_err(|_| {
                            format!("lotus switch `{other}`: expected a percentage")
                        })?;
                    } else {
                        return Err(format!(
                            "unknown lotus switch `{other}` (known: si, no-sharding, no-routing, no-vt-cache, rdma-lock, early-unlock, reshard, reshard=US, drain=US, overload=PCT, reshard-no-drain, restart=US, restart-early, restart-same-ids, versions=N)"
                        ));
                    }
                }
            }
        }
        Ok(p)
    }
}

/// Each coordinator's commit-log region for `spec`: the floor, or the log of the
/// workload's largest write set (one entry per record written, §5.1) if larger.
#[must_use]
pub fn commit_log_region_bytes(spec: &DeploySpec) -> u32 {
    spec.log_region_for(dmem_lotus::recovery::LOG_FIXED_BYTES as u64, |_| {
        dmem_lotus::recovery::LOG_ENTRY_BYTES as u64
    })
}

impl LotusProtocol {
    /// Every CN's lock table and its lock servers as simulated tasks (§4.1), and with
    /// resharding on, one load monitor per CN (§4.3) over the metrics region after `base`'s
    /// store on MN 0.
    fn sim_lock_cluster(
        &self,
        sim: &Rc<Sim>,
        spec: &DeploySpec,
        base: &MvccDeploy,
    ) -> Result<Rc<LockCluster>, DeployError> {
        let cns = sim.cn_count();
        let threads = sim.threads_per_cn();
        let sharding = self.sharding(spec);
        let map = Rc::new(RefCell::new(ShardMap::new(cns)));
        let table_bytes = self.lock_table_bytes(spec);
        let locks: Vec<Arc<CnLocks>> = (0..cns)
            .map(|c| Arc::new(CnLocks::new(c, table_bytes)))
            .collect();
        let mut servers = Vec::new();
        let mut contexts = Vec::new();
        for c in 0..cns {
            let mut row = Vec::new();
            for t in 0..threads {
                let ctx = sim.context(sim.cn(c), t)?;
                row.push(dmem_verbs::Verbs::local_endpoint(&ctx));
                contexts.push((c, ctx));
            }
            servers.push(row);
        }
        let cluster = Rc::new(LockCluster::new(
            locks,
            servers,
            map,
            sharding,
            self.lock_cpu_ns,
        ));
        *cluster.restarts.borrow_mut() = vec![Restart::new(self.restart_early); usize::from(cns)];
        for (c, ctx) in contexts {
            let task = serve(
                ctx.clone(),
                Rc::clone(&cluster),
                Arc::clone(&cluster.cns[usize::from(c)]),
            );
            sim.spawn(&ctx, task);
        }
        if self.reshard.enabled && cns > 1 && cns <= METRICS_CNS {
            // §4.3: the metrics region after the store on MN 0; one monitor per CN.
            let region = base.store.addr(0, base.store.bytes_per_mn());
            debug_assert!(
                CnMetric::BYTES as u64 * u64::from(cns)
                    <= dmem_lotus::reshard::region_bytes(METRICS_CNS)
            );
            for c in 0..cns {
                let ctx = sim.context(sim.cn(c), 0)?;
                let task = monitor(ctx.clone(), Rc::clone(&cluster), c, 0, region, self.reshard);
                sim.spawn(&ctx, task);
            }
        }
        Ok(cluster)
    }

    /// Motor's MVCC store on `memory` with a commit-log region per coordinator (LOTUS
    /// §4.4: a full record per version), its records laid out as [`Self::records`] says.
    pub(crate) fn store(
        &self,
        memory: MnMemory,
        spec: &DeploySpec,
        history: Recorder,
    ) -> Result<MvccDeploy, DeployError> {
        MvccDeploy::new(
            memory,
            spec,
            history,
            commit_log_region_bytes(spec),
            VersionLayout::FullRecords,
            self.records(),
            self.versions,
        )
    }

    /// Key to shard for `spec`'s tables (§4.2; by hash for the `no-sharding` ablation).
    pub(crate) fn sharding(&self, spec: &DeploySpec) -> Sharding {
        let mut sharding = Sharding::new(spec.critical_fields.clone());
        sharding.random = self.random_sharding;
        sharding
    }

    /// Bytes of lock slots per CN for `spec`. Slots are occupied by held locks (a few per
    /// running transaction), not records: the paper's 32 MB, or 16 B per record for data
    /// sets small enough that 32 MB per CN would only cost memory and time (at least
    /// 64 KiB).
    pub(crate) fn lock_table_bytes(&self, spec: &DeploySpec) -> usize {
        let records: u64 = spec.tables.iter().map(|t| t.expected_records).sum();
        usize::try_from(records.saturating_mul(16))
            .unwrap_or(usize::MAX)
            .clamp(64 << 10, self.lock_table_bytes.max(64 << 10))
    }
}

/// `protocol` on real MN memory (`memory` is not the simulator's), or why not.
fn deploy_process(
    protocol: &LotusProtocol,
    memory: MnMemory,
    spec: &DeploySpec,
    history: Recorder,
    placed: Option<Arc<LoadIndex>>,
) -> Result<Box<dyn Deployment>, DeployError> {
    let sim_only = |reason: &str| DeployError::SimOnly {
        protocol: protocol.name(),
        reason: reason.to_owned(),
    };
    if protocol.config.rdma_lock {
        return Err(sim_only(
            "`rdma-lock` (§8.4's idealised CN-counted RDMA lock) reads every CN's lock table directly; across processes a CN reaches another's table only by messages",
        ));
    }
    if protocol.reshard.enabled {
        return Err(sim_only(
            "resharding (§4.3) moves shards through the shard map every CN shares; across processes the shard map is static",
        ));
    }
    if protocol.restart_after.is_some() || protocol.early_unlock {
        return Err(sim_only(
            "a CN restart (§6) and the `early-unlock` planted bug run on the simulator: `dmem cluster` does not restart a killed CN, and its recovery always releases locks after the logs are decided",
        ));
    }
    let base = match placed {
        Some(placed) => protocol
            .store(memory, spec, history)?
            .with_placement(placed),
        None => protocol.store(memory, spec, history)?,
    };
    Ok(Box::new(LotusProcessDeployment::new(
        protocol.name(),
        protocol.config,
        base,
        protocol.sharding(spec),
        protocol.lock_table_bytes(spec),
        protocol.lock_cpu_ns,
        protocol.tables.clone(),
    )))
}

impl Protocol for LotusProtocol {
    fn name(&self) -> String {
        self.name.clone()
    }

    /// `lotus:restart=US`, `lotus:si+restart=US`, `lotus:FLAGS+restart=US` (LOTUS §6 CN restart).
    fn restarting_name(&self, after_us: u64) -> Option<String> {
        match self.name.as_str() {
            "lotus" => Some(format!("lotus:restart={after_us}")),
            "lotus-si" => Some(format!("lotus:si+restart={after_us}")),
            n if n.starts_with("lotus:") => Some(format!("{n}+restart={after_us}")),
            _ => None,
        }
    }

    fn isolation(&self) -> dmem_txn::Isolation {
        match self.config.isolation {
            dmem_lotus::Isolation::Serializable => dmem_txn::Isolation::Serializable,
            dmem_lotus::Isolation::Snapshot => dmem_txn::Isolation::Snapshot,
        }
    }

    /// LOTUS §3 (Workflow): CNs talk through UD-based RPCs "with a timeout mechanism
    /// ensuring reliability"; here a lock request that gets no reply within
    /// `rpc_timeout` aborts its transaction.
    fn tolerates_message_loss(&self) -> bool {
        true
    }

    /// As Motor's (the same store and loader; its lock tables and VT caches are bounded
    /// per CN).
    fn cn_bytes_per_hashed_record(&self) -> Option<u64> {
        Some(crate::mvcc_deploy::MVCC_CN_BYTES_PER_HASHED_RECORD)
    }

    fn mn_bytes_per_mn(&self, spec: &DeploySpec, mns: u16) -> Result<u64, DeployError> {
        // The store, then resharding's metrics region (§4.3).
        Ok(MvccDeploy::mn_bytes(
            spec,
            mns,
            commit_log_region_bytes(spec),
            VersionLayout::FullRecords,
            self.records(),
            self.versions,
        )? + dmem_lotus::reshard::region_bytes(METRICS_CNS))
    }

    /// A CN process's cores (`crate::lotus_process`) take its one dry load as Motor's do:
    /// the loader's [`dmem_store::LoadIndex`], shared read-only. The simulator's deployment
    /// is one for every CN and never split across cores: `None` there.
    fn deploy_placed(
        &self,
        memory: MnMemory,
        spec: &DeploySpec,
        history: Recorder,
        placement: &Placement,
    ) -> Option<Result<Box<dyn Deployment>, DeployError>> {
        if memory.as_sim().is_some() {
            return None;
        }
        Some(
            crate::common::placed_index(&self.name, placement)
                .and_then(|placed| deploy_process(self, memory, spec, history, Some(placed))),
        )
    }

    fn deploy_on(
        &self,
        memory: MnMemory,
        spec: &DeploySpec,
        history: Recorder,
    ) -> Result<Box<dyn Deployment>, DeployError> {
        // On the simulator every CN's lock servers are simulated tasks of this deployment;
        // on a real fabric each CN process serves its own table (`crate::lotus_process`).
        let Some(sim) = memory.as_sim().map(Rc::clone) else {
            return deploy_process(self, memory, spec, history, None);
        };
        let sim = &sim;
        let base = self.store(memory, spec, history)?;
        let cluster = self.sim_lock_cluster(sim, spec, &base)?;
        let (map, sharding) = (Rc::clone(&cluster.map), cluster.sharding.clone());
        let down = Rc::new(RefCell::new(Vec::new()));
        let router: Option<Rc<dyn Router>> = (!self.no_routing).then(|| {
            Rc::new(LotusRouter {
                map: Rc::clone(&map),
                sharding,
                down: Rc::clone(&down),
            }) as Rc<dyn Router>
        });
        Ok(Box::new(LotusDeployment {
            config: self.config,
            early_unlock: self.early_unlock,
            restart_after: self.restart_after,
            restart_same_ids: self.restart_same_ids,
            down,
            restarts: Rc::new(RefCell::new(Vec::new())),
            base,
            cluster,
            router,
            placed: Vec::new(),
            paused: Rc::new(Cell::new(false)),
            events: Rc::new(RefCell::new(Vec::new())),
            error: Rc::new(RefCell::new(None)),
            runner: Rc::new(RefCell::new(None)),
        }))
    }
}

/// Hybrid routing (LOTUS §4.3) over the deployment's shard map.
struct LotusRouter {
    map: Rc<RefCell<ShardMap>>,
    sharding: Sharding,
    /// CNs that crashed and run no coordinators (until a restarted CN's coordinators start
    /// again, if its runner starts them), so what would go there runs where it was
    /// generated.
    down: Rc<RefCell<Vec<u16>>>,
}

impl Router for LotusRouter {
    fn route(&self, kind: TxnKind, first: Option<(TableId, Key)>, random: u64) -> Option<u16> {
        self.map
            .borrow()
            .route(&self.sharding, kind, first, random)
            .filter(|cn| !self.down.borrow().contains(cn))
    }
}

/// Updates `cn`'s latest restart record, if it has one.
fn update_last_restart(
    restarts: &RefCell<Vec<RestartRecord>>,
    cn: u16,
    update: impl FnOnce(&mut RestartRecord),
) {
    if let Some(r) = restarts.borrow_mut().iter_mut().rev().find(|r| r.cn == cn) {
        update(r);
    }
}

/// One CN's restart as it happened (LOTUS §6), virtual ns.
#[derive(Debug, Clone, Copy, Default)]
struct RestartRecord {
    cn: u16,
    detected_at: u64,
    /// The survivors finished its recovery.
    recovered_at: Option<u64>,
    /// It came back with an empty table.
    restarted_at: Option<u64>,
    /// It broadcast that its old transactions are finished and serves again.
    serving_at: Option<u64>,
    /// Locks its old table still held when it came back (all dropped).
    stale_locks: usize,
    /// Its lock grants (the table's counter) when it came back, when its recovery ended
    /// and when it broadcast.
    grants_at_restart: u64,
    grants_at_recovered: Option<u64>,
    grants_at_serving: u64,
    /// Its grants when it failed again (the end of this incarnation's serving).
    grants_at_next_failure: Option<u64>,
    /// Coordinators its new incarnation started (0: it serves locks only).
    coordinators: usize,
}

/// LOTUS on one simulated cluster (what [`LotusProtocol`] deploys).
pub struct LotusDeployment {
    config: LotusConfig,
    early_unlock: bool,
    restart_after: Option<u64>,
    restart_same_ids: bool,
    /// CNs that crashed (the router sends nothing there).
    down: Rc<RefCell<Vec<u16>>>,
    restarts: Rc<RefCell<Vec<RestartRecord>>>,
    base: MvccDeploy,
    cluster: Rc<LockCluster>,
    router: Option<Rc<dyn Router>>,
    /// Coordinator ids, the CN (index) and the thread each runs on.
    placed: Vec<(u16, u16, u16)>,
    paused: Rc<Cell<bool>>,
    events: Rc<RefCell<Vec<RecoveryEvent>>>,
    error: Rc<RefCell<Option<String>>>,
    /// Runs restarted CNs' coordinators (LOTUS §6; set by `SimRecovery::run_late_coordinators`;
    /// without it a restarted CN serves locks only).
    runner: Rc<RefCell<Option<LateCoordinators>>>,
}

/// Writes recovery's decision into the history (the coordinator's transaction recorded
/// `Unknown` after its commit timestamp): committed if rolled forward, aborted with nothing
/// installed otherwise.
fn settle(history: &RefCell<History>, coordinator: u16, decided: Decided, now: u64) -> bool {
    let mut h = history.borrow_mut();
    let mut changed = false;
    for t in h.txns.iter_mut().filter(|t| {
        t.id.coordinator.0 == u32::from(coordinator) && t.outcome == TxnOutcome::Unknown
    }) {
        changed = true;
        match decided {
            Decided::RolledForward { txn, .. } if txn == t.id => {
                t.outcome = TxnOutcome::Committed;
                t.end = now;
            }
            _ => {
                t.outcome = TxnOutcome::Aborted;
                t.writes.clear();
            }
        }
    }
    changed
}

/// What recovery did for each coordinator of a failed CN, from the decisions its logs gave
/// (`decisions`, in the order of `ids`), settling each one's in-flight transaction in
/// `history` at `now`.
fn recovered_coordinators(
    history: &RefCell<History>,
    ids: &[u16],
    decisions: &[Decided],
    now: u64,
) -> Vec<RecoveredCoordinator> {
    let mut coordinators = Vec::new();
    for (&id, &decided) in ids.iter().zip(decisions) {
        let in_flight = settle(history, id, decided, now);
        let (txn, decision, restored) = match decided {
            Decided::Nothing => (None, None, 0),
            // The last logged transaction had finished: nothing was in flight.
            Decided::RolledForward { cells: 0, .. } if !in_flight => (None, None, 0),
            Decided::RolledForward { txn, cells, .. } => {
                (Some(txn.seq), Some(Decision::RollForward), cells)
            }
            Decided::RolledBack { txn, cells } => (Some(txn.seq), Some(Decision::RollBack), cells),
        };
        coordinators.push(RecoveredCoordinator {
            coordinator: id,
            txn,
            decision,
            restored,
            unlocked: 0,
        });
    }
    coordinators
}

/// The failure detector's and restart's state shared by their simulated tasks (§6).
struct Shell {
    sim: Rc<Sim>,
    cluster: Rc<LockCluster>,
    store: Rc<dmem_store::Store>,
    shapes: Rc<dmem_motor::mvcc::Shapes>,
    recorder: Recorder,
    config: LotusConfig,
    early_unlock: bool,
    restart_after: Option<u64>,
    restart_same_ids: bool,
    poll: u64,
    /// Coordinator ids, the CN (index) and the thread each runs on.
    placed: Vec<(u16, u16, u16)>,
    down: Rc<RefCell<Vec<u16>>>,
    restarts: Rc<RefCell<Vec<RestartRecord>>>,
    events: Rc<RefCell<Vec<RecoveryEvent>>>,
    error: Rc<RefCell<Option<String>>>,
    runner: Rc<RefCell<Option<LateCoordinators>>>,
}

impl Shell {
    /// What the detector does for crashed `node` (§6): declare it failed, start its restart
    /// (with `restart=US`), recover it. A CN that restarted and crashed again is reported
    /// again and recovered again, its new incarnation's transactions like the old ones'.
    async fn on_crash(self: Rc<Self>, rc: SimContext, node: dmem_verbs::NodeId) {
        let sim = &self.sim;
        let cluster = &self.cluster;
        let Some(cn) = (0..sim.cn_count()).find(|&i| sim.cn(i) == node) else {
            return;
        };
        // Reported once per crash; a CN whose failure is being handled (not serving) is
        // not handled twice. A restarted CN that crashes again, even during its rejoin
        // broadcast (it serves, survivors still count it failed), is.
        if cluster.restarts.borrow()[usize::from(cn)].phase() != Phase::Serving {
            return;
        }
        let ids: Vec<u16> = self
            .placed
            .iter()
            .filter(|(_, x, _)| *x == cn)
            .map(|(id, _, _)| *id)
            .collect();
        if !cluster.is_failed(cn) {
            cluster.failed.borrow_mut().push(cn);
        }
        cluster.restarts.borrow_mut()[usize::from(cn)].step(Event::Failed);
        if !self.down.borrow().contains(&cn) {
            self.down.borrow_mut().push(cn);
        }
        if let Some(delay) = self.restart_after {
            // Locks granted by its old table die with it: a survivor holding
            // one aborts at commit even after the CN serves again.
            {
                let mut map = cluster.map.borrow_mut();
                for s in map.shards_of(cn) {
                    map.abort_holders(s);
                    // A hand-over it had begun ends: the shard stays its own.
                    if map.is_moving(s) {
                        map.finish_move(s, cn);
                    }
                }
            }
            let grants = cluster.cns[usize::from(cn)].served.get().1;
            update_last_restart(&self.restarts, cn, |last| {
                last.grants_at_next_failure.get_or_insert(grants);
            });
            self.restarts.borrow_mut().push(RestartRecord {
                cn,
                detected_at: rc.now(),
                ..RestartRecord::default()
            });
            let (shell, rc2) = (Rc::clone(&self), rc.clone());
            sim.spawn(&rc, async move {
                if let Err(e) = shell.restart_cn(rc2, cn, delay).await {
                    shell.error.borrow_mut().get_or_insert(e);
                }
            });
        }
        match self.recover_cn(&rc, &ids, cn).await {
            Ok(ev) => self.events.borrow_mut().push(ev),
            Err(e) => {
                self.error.borrow_mut().get_or_insert(e);
            }
        }
    }

    /// LOTUS §6 for CN `cn` (index), failed: transactions decided from commit logs, then
    /// its locks released on every survivor, then its shards served again from empty
    /// tables (by survivors, or by the CN itself once restarted).
    async fn recover_cn(
        self: &Rc<Self>,
        c: &SimContext,
        ids: &[u16],
        cn: u16,
    ) -> Result<RecoveryEvent, String> {
        let (sim, cluster) = (&self.sim, &self.cluster);
        let history = self.recorder.history();
        let node = sim.cn(cn);
        let detected_at = c.now();
        // Cut the CN off every MN: no late WRITE of it lands after its logs are read.
        for mn in 0..sim.mn_count() {
            SimLinkTerminator(Rc::clone(sim)).terminate(sim.mn(mn), node);
        }
        let terminated_at = c.now();
        let mut unlocked = if self.early_unlock {
            self.release_locks_of(c, cn).await?
        } else {
            0
        };
        // Every coordinator of the CN at once: three round trips (`recover_coordinators`).
        // A restarted CN's coordinators keep their ids and log regions; their transactions'
        // sequence numbers are above every earlier incarnation's, so the newest whole log
        // is the latest incarnation's if it logged anything (an older, already decided log
        // decides nothing again: its cells are visible, free, or another writer's).
        let decisions = recover_coordinators(c, &self.store, &self.shapes, ids)
            .await
            .map_err(|e| format!("recovering CN {cn}'s coordinators: {e}"))?;
        let mut coordinators = recovered_coordinators(history, ids, &decisions, c.now());
        let logs_recovered_at = c.now();
        if !self.early_unlock {
            unlocked = self.release_locks_of(c, cn).await?;
        }
        if let Some(first) = coordinators.first_mut() {
            first.unlocked = unlocked;
        }
        // Survivors' transactions already committing with locks of the failed CN finish
        // first; the others abort when they reach commit.
        while cluster.committing.borrow()[usize::from(cn)] > 0 {
            c.sleep(self.poll).await;
        }
        self.hand_back_shards(c, cn)?;
        Ok(RecoveryEvent {
            cn: node,
            detected_at,
            terminated_at,
            logs_recovered_at,
            finished_at: c.now(),
            coordinators,
            scanned_locks: 0,
        })
    }

    /// The membership service's notice to every live CN (`membership`): each fences CN
    /// `cn` and releases its locks, then replies; a message like the lock RPCs. Returns
    /// the locks released.
    async fn release_locks_of(&self, c: &SimContext, cn: u16) -> Result<usize, String> {
        let (sim, cluster) = (&self.sim, &self.cluster);
        let to: Vec<u16> = (0..sim.cn_count())
            .filter(|&x| x != cn && !sim.is_crashed(sim.cn(x)))
            .collect();
        let before = cluster.released.borrow()[usize::from(cn)];
        let ctx = sim
            .context(c.node(), c.thread())
            .map_err(|e| format!("recovering CN {cn}: {e}"))?;
        let timeout = self.config.rpc_timeout;
        notify(&ctx, cluster, RequestKind::Release, cn, &to, timeout)
            .await
            .map_err(|e| format!("recovering CN {cn}: {e}"))?;
        let after = cluster.released.borrow()[usize::from(cn)];
        Ok(usize::try_from(after - before).unwrap_or(usize::MAX))
    }

    /// The failed CN `cn`'s shards once its recovery is over: they wait for its restarted
    /// incarnation (§6), or start empty at the live CNs.
    fn hand_back_shards(self: &Rc<Self>, c: &SimContext, cn: u16) -> Result<(), String> {
        let (sim, cluster) = (&self.sim, &self.cluster);
        if self.restart_after.is_some() {
            // §6: its shards wait for its restarted incarnation, which broadcasts once this
            // recovery is over and it is up again, whichever comes last.
            update_last_restart(&self.restarts, cn, |r| {
                r.recovered_at = Some(c.now());
                r.grants_at_recovered = r
                    .restarted_at
                    .map(|_| cluster.cns[usize::from(cn)].served.get().1);
            });
            let action = cluster.restarts.borrow_mut()[usize::from(cn)].step(Event::Recovered);
            if action == Action::Broadcast {
                self.broadcast(cn)?;
            }
        } else {
            // The failed CN's lock table is not rebuilt: its shards start empty elsewhere.
            let live: Vec<u16> = (0..sim.cn_count())
                .filter(|&x| !cluster.is_failed(x) && !sim.is_crashed(sim.cn(x)))
                .collect();
            if !live.is_empty() {
                let mut map = cluster.map.borrow_mut();
                // `finish_move`: a hand-over the failed CN had begun ends here too.
                for (i, s) in map.shards_of(cn).into_iter().enumerate() {
                    map.finish_move(s, live[i % live.len()]);
                }
            }
        }
        Ok(())
    }

    /// The restarted CN `cn`'s broadcast (§6) "all transactions of my old incarnation have
    /// finished", sent by the CN itself (a task on its thread 0): a [`RequestKind::Rejoin`]
    /// message to every live CN, which unfences it and replies (`membership`). Once every
    /// reply is in, survivors ask it for locks again (it leaves the failed list, the state
    /// the simulated CNs share, as the shard map), its MN connections are back and its
    /// coordinators of the new incarnation start, if a runner was given.
    fn broadcast(self: &Rc<Self>, cn: u16) -> Result<(), String> {
        let node = self.sim.cn(cn);
        let ctx = self
            .sim
            .context(node, 0)
            .map_err(|e| format!("CN {cn}'s broadcast: {e}"))?;
        let shell = Rc::clone(self);
        let task_ctx = ctx.clone();
        self.sim.spawn(&task_ctx, async move {
            if let Err(e) = shell.rejoin(&ctx, cn).await {
                shell.error.borrow_mut().get_or_insert(e);
            }
        });
        Ok(())
    }

    /// The broadcast's task ([`Shell::broadcast`]).
    async fn rejoin(&self, ctx: &SimContext, cn: u16) -> Result<(), String> {
        let (sim, cluster) = (&self.sim, &self.cluster);
        let to: Vec<u16> = (0..sim.cn_count())
            .filter(|&x| x != cn && !sim.is_crashed(sim.cn(x)))
            .collect();
        notify(
            ctx,
            cluster,
            RequestKind::Rejoin,
            cn,
            &to,
            self.config.rpc_timeout,
        )
        .await
        .map_err(|e| format!("CN {cn}'s broadcast: {e}"))?;
        cluster.failed.borrow_mut().retain(|&x| x != cn);
        restore_links(sim, sim.cn(cn));
        update_last_restart(&self.restarts, cn, |r| {
            r.serving_at = Some(ctx.now());
            r.grants_at_serving = cluster.cns[usize::from(cn)].served.get().1;
        });
        self.start_coordinators(cn)
    }

    /// Starts restarted CN `cn`'s coordinators of its current incarnation through the
    /// runner: the same ids and threads as before the crash, a fresh address cache (the
    /// old one was in the CN's memory; the VT cache was emptied with its table) and a fresh
    /// timestamp service.
    fn start_coordinators(&self, cn: u16) -> Result<(), String> {
        let Some(run) = self.runner.borrow().clone() else {
            return Ok(());
        };
        let incarnation = self.cluster.restarts.borrow()[usize::from(cn)].incarnation();
        let node = self.sim.cn(cn);
        let cache = Rc::new(RefCell::new(dmem_store::AddressCache::new()));
        for &(id, _, thread) in self.placed.iter().filter(|(_, x, _)| *x == cn) {
            let ctx = self
                .sim
                .context(node, thread)
                .map_err(|e| format!("a coordinator on restarted CN {cn}: {e}"))?;
            let ts = SyncedClock::new(ctx.clone(), node, id, self.config.epsilon);
            let co = LotusCoordinator::new(
                ctx.clone(),
                cn,
                thread,
                Rc::clone(&self.cluster),
                Rc::clone(&self.store),
                Rc::clone(&self.shapes),
                self.config,
                id,
                Rc::clone(&cache),
                self.recorder.clone(),
                ts,
            )
            .in_incarnation(if self.restart_same_ids {
                0
            } else {
                incarnation
            });
            run(ctx, id, Box::new(co));
        }
        // Its coordinators run again: the router may send it transactions.
        self.down.borrow_mut().retain(|&x| x != cn);
        update_last_restart(&self.restarts, cn, |r| {
            r.coordinators = self.placed.iter().filter(|(_, x, _)| *x == cn).count();
        });
        Ok(())
    }

    /// Restarts failed CN `cn` `delay` ns from now (§6): the simulator brings it back, its
    /// table is emptied (the old one is lost with the CN; nothing is rebuilt), new lock
    /// servers start on its threads and refuse until the broadcast, which happens here if
    /// its recovery is already over.
    async fn restart_cn(self: &Rc<Self>, c: SimContext, cn: u16, delay: u64) -> Result<(), String> {
        let (sim, cluster) = (&self.sim, &self.cluster);
        let node = sim.cn(cn);
        restart_crashed_cn(sim, &c, node, delay, self.poll)
            .await
            .map_err(|e| format!("CN {cn}: {e}"))?;
        let locks = Arc::clone(&cluster.cns[usize::from(cn)]);
        let stale = locks.reset(sim.cn_count());
        // The fresh table fences nobody: only live incarnations can reach its new servers
        // (messages to the old ones are gone), and a CN that fails from now on is fenced by
        // its failure notice. (Fences the old table had set are dropped with it: a CN whose
        // rejoin broadcast missed this one while it was down must not stay fenced here.)
        for x in 0..sim.cn_count() {
            locks.table.unfence(x);
        }
        let mut row = Vec::new();
        for t in 0..sim.threads_per_cn() {
            let ctx = sim
                .context(node, t)
                .map_err(|e| format!("restarting CN {cn}: {e}"))?;
            row.push(dmem_verbs::Verbs::local_endpoint(&ctx));
            sim.spawn(
                &ctx,
                serve(ctx.clone(), Rc::clone(cluster), Arc::clone(&locks)),
            );
        }
        cluster.servers.borrow_mut()[usize::from(cn)] = row;
        update_last_restart(&self.restarts, cn, |r| {
            r.restarted_at = Some(c.now());
            r.stale_locks = stale;
            r.grants_at_restart = locks.served.get().1;
        });
        let action = cluster.restarts.borrow_mut()[usize::from(cn)].step(Event::Restarted);
        if action == Action::Broadcast {
            self.broadcast(cn)?;
        }
        Ok(())
    }
}

impl Deployment for LotusDeployment {
    fn load(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), DeployError> {
        self.base.load(table, key, value)
    }

    fn coordinator(&mut self, ctx: AnyContext, id: u16) -> Result<BoxCoordinator, DeployError> {
        let cache = self.base.cache_of(ctx.node());
        let ts = SyncedClock::new(ctx.clone(), ctx.node(), id, self.config.epsilon);
        let cn = ctx.node().0 - self.base.memory.mn_count();
        let thread = ctx
            .as_sim()
            .ok_or_else(|| DeployError::SimOnly {
                protocol: "lotus".to_owned(),
                reason: format!("a coordinator on a {} context", ctx.fabric()),
            })?
            .thread();
        self.placed.push((id, cn, thread));
        Ok(Box::new(LotusCoordinator::new(
            ctx,
            cn,
            thread,
            Rc::clone(&self.cluster),
            Rc::clone(&self.base.store),
            Rc::clone(&self.base.shapes),
            self.config,
            id,
            cache,
            self.base.history.clone(),
            ts,
        )))
    }

    fn read_final(&self, table: TableId, key: Key) -> Option<Vec<u8>> {
        self.base.read_final(table, key)
    }

    fn counter(&self, name: &str) -> Option<u64> {
        self.lock_counter(name)
            .or_else(|| self.reshard_counter(name))
            .or_else(|| self.restart_counter(name))
    }

    fn router(&self) -> Option<Rc<dyn Router>> {
        self.router.clone()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn sim_recovery(&mut self) -> Option<&mut dyn SimRecovery> {
        Some(self)
    }
}

impl LotusDeployment {
    /// The CN lock tables' counters (§4.1), summed over the CNs.
    fn lock_counter(&self, name: &str) -> Option<u64> {
        let sum = |f: fn((u64, u64, u64)) -> u64| {
            self.cluster.cns.iter().map(|c| f(c.served.get())).sum()
        };
        match name {
            "lock_messages_served" => Some(sum(|s| s.0)),
            "lock_requests_granted" => Some(sum(|s| s.1)),
            "lock_requests_refused" => Some(sum(|s| s.2)),
            "lotus_locks_held" => {
                Some(self.cluster.cns.iter().map(|c| c.table.held() as u64).sum())
            }
            // Refusals, summed over the CNs (`CnLocks::refusal_counter`).
            name if name.starts_with("lotus_refused_") => self
                .cluster
                .cns
                .iter()
                .filter_map(|c| c.refusal_counter(name))
                .reduce(|a, b| a + b),
            // Live CNs' tables fencing a CN that is not failed (should be 0 once quiescent:
            // such a CN's transactions would be refused there for good).
            "lotus_stale_fences" => {
                let cns = self.cluster.cns.len() as u16;
                Some(
                    (0..cns)
                        .filter(|&i| !self.cluster.is_failed(i))
                        .map(|i| {
                            (0..cns)
                                .filter(|&x| {
                                    self.cluster.cns[usize::from(i)].table.is_fenced(x)
                                        && !self.cluster.is_failed(x)
                                })
                                .count() as u64
                        })
                        .sum(),
                )
            }
            _ => None,
        }
    }

    /// Resharding's hand-overs (§4.3).
    fn reshard_counter(&self, name: &str) -> Option<u64> {
        match name {
            "reshard_handovers" => Some(self.cluster.handovers.borrow().len() as u64),
            "reshard_interruption_max_ns" => self
                .cluster
                .handovers
                .borrow()
                .iter()
                .map(dmem_lotus::reshard::HandoverEvent::interruption)
                .max(),
            "reshard_interruption_mean_ns" => {
                let h = self.cluster.handovers.borrow();
                let sum: u64 = h
                    .iter()
                    .map(dmem_lotus::reshard::HandoverEvent::interruption)
                    .sum();
                sum.checked_div(h.len() as u64)
            }
            "reshard_holders_left" => Some(
                self.cluster
                    .handovers
                    .borrow()
                    .iter()
                    .map(|e| e.holders_left)
                    .sum(),
            ),
            "reshard_aborted_holders" => Some(
                self.cluster
                    .handovers
                    .borrow()
                    .iter()
                    .map(|e| e.aborted_holders)
                    .sum(),
            ),

            _ => None,
        }
    }

    /// CN restarts (§6).
    fn restart_counter(&self, name: &str) -> Option<u64> {
        match name {
            "cn_restarts" => Some(
                self.restarts
                    .borrow()
                    .iter()
                    .filter(|r| r.serving_at.is_some())
                    .count() as u64,
            ),
            // The last restarted CN's broadcast, virtual ns from the start.
            "cn_serving_again_at_ns" => self
                .restarts
                .borrow()
                .iter()
                .filter_map(|r| r.serving_at)
                .max(),
            // Longest span from a CN's detected failure to its broadcast.
            "cn_detected_to_serving_max_ns" => self
                .restarts
                .borrow()
                .iter()
                .filter_map(|r| Some(r.serving_at? - r.detected_at))
                .max(),
            // Broadcasts made before the CN's recovery was over (the planted bug).
            "lotus_restart_early_broadcasts" => Some(
                self.restarts
                    .borrow()
                    .iter()
                    .filter(|r| match (r.serving_at, r.recovered_at) {
                        (Some(s), Some(d)) => s < d,
                        (Some(_), None) => true,
                        _ => false,
                    })
                    .count() as u64,
            ),
            // Locks a restarted CN granted while its recovery was still under way.
            "lotus_restart_grants_before_recovered" => Some(
                self.restarts
                    .borrow()
                    .iter()
                    .map(|r| {
                        r.grants_at_recovered
                            .unwrap_or(r.grants_at_restart)
                            .saturating_sub(r.grants_at_restart)
                    })
                    .sum(),
            ),
            // Locks restarted CNs granted after their broadcast (they serve again).
            "lotus_restart_grants_after" => Some(
                self.restarts
                    .borrow()
                    .iter()
                    .filter(|r| r.serving_at.is_some())
                    .map(|r| {
                        r.grants_at_next_failure
                            .unwrap_or_else(|| self.cluster.cns[usize::from(r.cn)].served.get().1)
                            .saturating_sub(r.grants_at_serving)
                    })
                    .sum(),
            ),
            // Coordinators restarted CNs ran again (a runner was given).
            "restarted_coordinators" => Some(
                self.restarts
                    .borrow()
                    .iter()
                    .map(|r| r.coordinators as u64)
                    .sum(),
            ),
            "lotus_restart_stale_locks" => Some(
                self.restarts
                    .borrow()
                    .iter()
                    .map(|r| r.stale_locks as u64)
                    .sum(),
            ),
            _ => None,
        }
    }
}

impl SimRecovery for LotusDeployment {
    /// The coordinators of every CN that restarts (`restart=US`) go to `run` from its
    /// broadcast on (LOTUS §6: the restarted CN executes transactions again); the runner
    /// (`dmem recover`) gives them work and counts their commits. Call before the run.
    fn run_late_coordinators(&self, run: LateCoordinators) {
        *self.runner.borrow_mut() = Some(run);
    }

    /// The membership service is an oracle ([`dmem_deploy::spawn_crash_watch`]; the OCC
    /// family and Motor use a heartbeat detector instead): every `poll` the task on
    /// `recovery_cn` asks the simulator which CNs crashed; a restarted CN that crashes
    /// again is reported again.
    fn start_recovery(
        &mut self,
        sim: &Rc<Sim>,
        recovery_cn: u16,
        timing: RecoveryTiming,
    ) -> Result<(), DeployError> {
        let shell = Rc::new(Shell {
            sim: Rc::clone(sim),
            cluster: Rc::clone(&self.cluster),
            store: Rc::clone(&self.base.store),
            shapes: Rc::clone(&self.base.shapes),
            recorder: self.base.history.clone(),
            config: self.config,
            early_unlock: self.early_unlock,
            restart_after: self.restart_after,
            restart_same_ids: self.restart_same_ids,
            poll: timing.poll,
            placed: self.placed.clone(),
            down: Rc::clone(&self.down),
            restarts: Rc::clone(&self.restarts),
            events: Rc::clone(&self.events),
            error: Rc::clone(&self.error),
            runner: Rc::clone(&self.runner),
        });
        let watched = Rc::clone(sim);
        // One recovery task per failed CN, so that concurrent failures are recovered in
        // parallel (§6 "Remarks").
        dmem_deploy::spawn_crash_watch(
            sim,
            recovery_cn,
            timing,
            move || (0..watched.cn_count()).map(|i| watched.cn(i)).collect(),
            move |rc: SimContext, node: dmem_verbs::NodeId| Rc::clone(&shell).on_crash(rc, node),
        )
    }

    fn recovery_events(&self) -> Vec<RecoveryEvent> {
        self.events.borrow().clone()
    }

    fn recovery_error(&self) -> Option<String> {
        self.error.borrow().clone()
    }

    fn paused(&self) -> Rc<Cell<bool>> {
        Rc::clone(&self.paused)
    }

    fn scan_cost(&self) -> Option<(u64, u64)> {
        self.base.scan_cost()
    }
}

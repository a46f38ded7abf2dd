//! LOTUS in the CN processes of a real cluster (`dmem cn`, `dmem bench --fabric tcp|shm`):
//! each CN process serves its own lock table to the other CNs over two-sided messages
//! (LOTUS §4.1), with the same coordinators, lock servers and wire format as on the
//! simulator.
//!
//! * Every process lays the same store out (`LotusProtocol::store`); an MN process loads
//!   its share, a CN process only addresses it.
//! * A CN process learns which CN it is from the cluster's
//!   [`ProcessPlan`]
//!   ([`ProcessDeployment::join_as_cn`]): its index among the plan's members is its LOTUS CN
//!   number (lock holders, shard owners), the members' `services` endpoints are the lock
//!   servers (slot `i` of every CN answers the `i`-th coordinator of the others, §4.1).
//!   Its [`LockCluster`] holds only its own table ([`LockCluster::of_process`]); the
//!   others are reached only by messages.
//! * [`ProcessDeployment::process_tasks`] runs one lock server ([`serve`]) per service context,
//!   beside the heartbeats every CN sends.
//! * **Several cores** (`threads > 1`: one executor and one deployment per core): the
//!   deployments of one CN in one process share **one** [`CnLocks`] — the lock table
//!   (atomic slot words, CPU CAS, lock state in per-bucket mutexes), the VT cache (§4.4)
//!   and the counters — found through the protocol value every core deploys from
//!   (`ProcessTables`, keyed by the CN's node and the run's state directory). Each core
//!   has its own [`LockCluster`] view (static in a process) over that table, so its
//!   coordinators take local locks on the table every core uses, and the lock servers grant
//!   remote requests on the same table and invalidate the one VT cache. Server `i` runs on
//!   the core of coordinator `i` ([`process::service_core`]: the first core's from
//!   `process_tasks`, the others' from [`ProcessDeployment::core_tasks`]), as the paper's
//!   coordinator threads serve their own lock requests; the `i`-th coordinator talks to
//!   server `i` of the other CNs whatever core either runs on: service endpoints are
//!   numbered by coordinator slot.
//! * **Recovery** (§6): the detector's [`LogRecovery`] decides a failed CN's commit logs,
//!   then the failure notice reaches every survivor's lock server (`NoticeAfterLogs`).
//!
//! What stays on the simulator, and why (each refused at deployment with one line):
//! pass-by-range resharding (§4.3) and CN restart (§6) change state every CN shares there
//! (the shard map, the restart broadcast); across processes the shard map is static and
//! `dmem cluster` does not restart a killed CN. The idealised RDMA lock of §8.4 reads every CN's
//! table directly. Hybrid routing (§4.3) needs a router in front of the CN processes,
//! which `dmem cluster` does not have: each CN runs what its own clients generate, and the
//! lock RPCs keep that correct.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::{Arc, Mutex, Weak};

use dmem_deploy::process::{
    self, CnContexts, LocalTask, LogRecovery, MessageLinkTerminator, ProcessPlan, ProcessRecovery,
    ServiceContext, StepFuture,
};
use dmem_deploy::{
    AnyContext, Decision, DeployError, Deployment, Placement, ProcessDeployment,
    RecoveredCoordinator, RecoveryEvent,
};
use dmem_lotus::membership::notify_passing;
use dmem_lotus::recovery::{Decided, recover_coordinator};
use dmem_lotus::wire::RequestKind;
use dmem_lotus::{CnLocks, LockCluster, LotusConfig, LotusCoordinator, Sharding, serve};
use dmem_motor::SyncedClock;
use dmem_txn::{BoxCoordinator, Key, TableId};
use dmem_verbs::{Clock, Nanos, NodeId, Verbs};

use crate::mvcc_deploy::MvccDeploy;

/// How long a coordinator waits for lock replies in real time before it aborts. The
/// simulator's 1 ms (`LotusConfig::rpc_timeout`) is a round trip plus queueing on an idle
/// simulated CN; a CN process shares its executor thread with its coordinators and its
/// host's cores with the other processes, and a descheduled peer answers tens of ms late
/// (an abort, then a retry, for nothing). A late reply is harmless: the unlocks sent on
/// abort follow the request on the same ordered connection.
pub const PROCESS_RPC_TIMEOUT: Nanos = 50_000_000;

/// The counters a LOTUS CN process reports ([`Deployment::counters`]).
const PROCESS_COUNTERS: [&str; 7] = [
    "lock_messages_served",
    "lock_requests_granted",
    "lock_requests_refused",
    "lotus_locks_held",
    "lotus_grants_on_this_core",
    "lotus_grants_by_other_cores",
    "lotus_served_by_other_cores",
];

/// The lock tables of the CNs one protocol value deployed in this process, so that the
/// deployments of one CN's cores (each core deploys on its own, `Rc`-based) find one
/// shared [`CnLocks`]. An entry lives as long as a deployment holds its table; it is
/// keyed by the CN's node and the run's state directory (fresh for each run), so that two
/// runs in one process never share a table.
#[derive(Debug, Clone, Default)]
pub(crate) struct ProcessTables(Arc<Mutex<Vec<SharedCn>>>);

#[derive(Debug)]
struct SharedCn {
    me: NodeId,
    state_dir: PathBuf,
    locks: Weak<CnLocks>,
    /// Deployments that joined as this CN so far: the next one's core number.
    cores: u16,
}

impl PartialEq for ProcessTables {
    /// Tables are state, not configuration: two protocol values are equal whatever they
    /// deployed.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for ProcessTables {}

impl ProcessTables {
    /// CN `me`'s table in the run of `plan` (made with `make` by the first deployment to
    /// join as `me`) and the joining deployment's core number (0, 1, ... in joining order).
    fn join(
        &self,
        me: NodeId,
        plan: &ProcessPlan,
        make: impl FnOnce() -> CnLocks,
    ) -> (Arc<CnLocks>, u16) {
        let mut cns = dmem_verbs::sync::lock_ignoring_poison(&self.0);
        cns.retain(|c| c.locks.strong_count() > 0);
        if let Some(c) = cns
            .iter_mut()
            .find(|c| c.me == me && c.state_dir == plan.state_dir)
            && let Some(locks) = c.locks.upgrade()
        {
            let core = c.cores;
            c.cores = c.cores.saturating_add(1);
            return (locks, core);
        }
        let locks = Arc::new(make());
        cns.push(SharedCn {
            me,
            state_dir: plan.state_dir.clone(),
            locks: Arc::downgrade(&locks),
            cores: 1,
        });
        (locks, 0)
    }
}

/// This process's CN, once [`ProcessDeployment::join_as_cn`] said which it is.
struct Joined {
    me: NodeId,
    /// Its LOTUS CN number (index among the plan's members).
    index: u16,
    /// Its coordinator ids in slot order: the `i`-th talks to server `i` of the others.
    slots: Vec<u16>,
    cluster: Rc<LockCluster>,
    /// Its own table (the only one in `cluster`), shared with its other cores.
    locks: Arc<CnLocks>,
    /// Which of the CN's cores this deployment serves (joining order).
    core: u16,
}

/// LOTUS deployed in one process of a real cluster: an MN process's loader, or a CN
/// process's coordinators and lock servers.
pub struct LotusProcessDeployment {
    name: String,
    config: LotusConfig,
    base: MvccDeploy,
    sharding: Sharding,
    table_bytes: usize,
    lock_cpu_ns: Nanos,
    joined: Option<Joined>,
    tables: ProcessTables,
    /// CN failures recovered by this process's detector (§6 across processes).
    events: Rc<RefCell<Vec<RecoveryEvent>>>,
}

impl LotusProcessDeployment {
    /// The deployment of one process named `name` (`crate::lotus` checks first that the
    /// protocol's switches run across processes), its lock replies awaited at least
    /// [`PROCESS_RPC_TIMEOUT`].
    pub(crate) fn new(
        name: String,
        mut config: LotusConfig,
        base: MvccDeploy,
        sharding: Sharding,
        table_bytes: usize,
        lock_cpu_ns: Nanos,
        tables: ProcessTables,
    ) -> Self {
        config.rpc_timeout = config.rpc_timeout.max(PROCESS_RPC_TIMEOUT);
        Self {
            name,
            config,
            base,
            sharding,
            table_bytes,
            lock_cpu_ns,
            joined: None,
            tables,
            events: Rc::default(),
        }
    }

    fn error(&self, reason: String) -> DeployError {
        DeployError::Protocol {
            protocol: self.name.clone(),
            reason,
        }
    }

    fn joined(&self, what: &str) -> Result<&Joined, DeployError> {
        self.joined.as_ref().ok_or_else(|| {
            self.error(format!(
                "{what} before `join_as_cn`: a LOTUS CN process must know which CN it is (it serves that CN's lock table)"
            ))
        })
    }

    /// One lock server ([`serve`]) per context of `services`, each on this CN's table;
    /// every context must be bound to the endpoint of its slot.
    fn lock_servers(
        &self,
        me: NodeId,
        plan: &ProcessPlan,
        services: Vec<ServiceContext>,
    ) -> Result<Vec<LocalTask>, DeployError> {
        let j = self.joined("the lock servers")?;
        let wanted = plan
            .member(me)
            .map(|m| m.services.clone())
            .unwrap_or_default();
        for s in &services {
            let given = s.ctx.local_endpoint();
            if me != j.me || wanted.get(s.slot) != Some(&given) {
                return Err(self.error(format!(
                    "the lock server of slot {} of node {} needs a context on {:?}, got {given:?}",
                    s.slot,
                    me.0,
                    wanted.get(s.slot)
                )));
            }
        }
        Ok(services
            .into_iter()
            .map(|s| -> LocalTask {
                Box::pin(serve(s.ctx, Rc::clone(&j.cluster), Arc::clone(&j.locks)))
            })
            .collect())
    }

    /// The coordinator ids in slot order (the `i`-th talks to lock server `i` of another
    /// CN), the lock servers of every member, and this CN's number.
    fn plan_of(me: NodeId, plan: &ProcessPlan) -> Option<(u16, Vec<u16>)> {
        let index = plan.index_of(me)?;
        let slots = plan.member(me)?.coordinators.clone();
        Some((index, slots))
    }
}

impl Deployment for LotusProcessDeployment {
    /// The loader's index (or the placement this core's deployment was given): the other
    /// cores of the CN process take it instead of loading again.
    fn placement(&self) -> Option<Placement> {
        Some(self.base.placement())
    }

    fn load(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), DeployError> {
        self.base.load_unless_placed(&self.name, table, key, value)
    }

    /// A coordinator of this CN; a worker id of the plan talks to the lock servers of its
    /// slot, any other id (the final check's) to slot 0.
    fn coordinator(&mut self, ctx: AnyContext, id: u16) -> Result<BoxCoordinator, DeployError> {
        let j = self.joined(&format!("a coordinator on a {} context", ctx.fabric()))?;
        if ctx.node() != j.me {
            return Err(self.error(format!(
                "a coordinator of node {} in the process of CN node {}",
                ctx.node().0,
                j.me.0
            )));
        }
        let thread = j.slots.iter().position(|&s| s == id).unwrap_or(0);
        let thread = u16::try_from(thread).unwrap_or(0);
        let (index, cluster) = (j.index, Rc::clone(&j.cluster));
        let cache = self.base.cache_of(ctx.node());
        let ts = SyncedClock::new(ctx.clone(), ctx.node(), id, self.config.epsilon);
        Ok(Box::new(LotusCoordinator::new(
            ctx,
            index,
            thread,
            cluster,
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

    /// This CN's lock server counters (the others' are in their processes), over every
    /// core of it; `lotus_grants_by_other_cores`: locks granted on this CN's table to the
    /// coordinators (or servers) of its cores other than this deployment's.
    fn counter(&self, name: &str) -> Option<u64> {
        let j = self.joined.as_ref()?;
        let locks = &j.locks;
        let (served, granted, refused) = locks.served.get();
        match name {
            "lock_messages_served" => Some(served),
            "lock_requests_granted" => Some(granted),
            "lock_requests_refused" => Some(refused),
            "lotus_locks_held" => Some(locks.table.held() as u64),
            "lotus_grants_on_this_core" => Some(locks.grants_on_core(j.core)),
            "lotus_grants_by_other_cores" => Some(locks.grants_off_core(j.core)),
            "lotus_served_by_other_cores" => Some(locks.served_off_core(j.core)),
            _ => locks.refusal_counter(name),
        }
    }

    /// The counters above and this CN's refusal counters (`CnLocks::refusal_counters`:
    /// refused on its table by reason, met by its coordinators by what the lock was for).
    fn counters(&self) -> Vec<(String, u64)> {
        let mut counters: Vec<(String, u64)> = PROCESS_COUNTERS
            .iter()
            .filter_map(|&name| Some((name.to_owned(), self.counter(name)?)))
            .collect();
        if let Some(j) = &self.joined {
            counters.extend(j.locks.refusal_counters());
        }
        counters
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    // No `sim_recovery`: this is the deployment of a CN process; the simulator's recovery
    // (§6) runs on the simulator's deployment (`crate::lotus`).

    fn processes(&mut self) -> Option<&mut dyn ProcessDeployment> {
        Some(self)
    }
}

impl ProcessDeployment for LotusProcessDeployment {
    /// This CN's number is its index in `plan`, its lock servers and the others' are the
    /// members' `services` (the same plan in every process, so every CN agrees on owners
    /// and endpoints).
    fn join_as_cn(&mut self, me: NodeId, plan: &ProcessPlan) -> Result<(), DeployError> {
        if let Some(j) = &self.joined {
            return Err(self.error(format!("node {} joined already as node {}", me.0, j.me.0)));
        }
        let (index, slots) = Self::plan_of(me, plan)
            .ok_or_else(|| self.error(format!("node {} is not a CN of the plan", me.0)))?;
        let cns = u16::try_from(plan.members.len())
            .map_err(|_| self.error("more CNs than LOTUS numbers".to_owned()))?;
        if let Some(m) = plan.members.iter().find(|m| m.services.is_empty()) {
            return Err(self.error(format!(
                "CN node {} offers no lock-server endpoints (`ClusterMember::services`)",
                m.cn.0
            )));
        }
        let servers = plan.members.iter().map(|m| m.services.clone()).collect();
        let table_bytes = self.table_bytes;
        let (locks, core) = self
            .tables
            .join(me, plan, || CnLocks::new(index, table_bytes));
        let cluster = Rc::new(LockCluster::of_process(
            Arc::clone(&locks),
            core,
            cns,
            servers,
            self.sharding.clone(),
            self.lock_cpu_ns,
        ));
        self.joined = Some(Joined {
            me,
            index,
            slots,
            cluster,
            locks,
            core,
        });
        Ok(())
    }

    /// Every core's deployment of this CN shares its lock table and VT cache
    /// (`ProcessTables`); the lock servers run on the core that runs `process_tasks`.
    fn splits_across_cores(&self) -> Result<(), String> {
        Ok(())
    }

    /// Heartbeats to the detector, and one lock server per service context of this CN
    /// (LOTUS §4.1), each serving this CN's table until the process ends.
    fn process_tasks(
        &mut self,
        me: NodeId,
        ctxs: CnContexts,
        plan: &ProcessPlan,
    ) -> Result<Vec<LocalTask>, DeployError> {
        let mut tasks = vec![process::alive_task(
            ctxs.heartbeat.clone(),
            plan.detector,
            plan.heartbeat,
        )];
        tasks.extend(self.lock_servers(me, plan, ctxs.services)?);
        Ok(tasks)
    }

    /// The lock servers of this core's share of the service endpoints (the `i`-th runs on
    /// the core of the `i`-th coordinator, as the paper's coordinator threads serve).
    fn core_tasks(
        &mut self,
        me: NodeId,
        plan: &ProcessPlan,
        services: Vec<ServiceContext>,
    ) -> Result<Vec<LocalTask>, DeployError> {
        self.lock_servers(me, plan, services)
    }

    /// §6 across processes (crate docs of this module): a failed CN cut off the MNs, its
    /// coordinators' transactions decided from their commit logs in MN memory, then the
    /// failure notice to every surviving CN's lock server (fence, release its locks).
    fn recovers_across_processes(&self) -> bool {
        true
    }

    fn process_recovery(
        &mut self,
        ctx: AnyContext,
        terminator: MessageLinkTerminator,
        plan: &ProcessPlan,
    ) -> Result<Option<Box<dyn ProcessRecovery>>, DeployError> {
        let j = self.joined("the detector")?;
        let cluster = Rc::clone(&j.cluster);
        let (store, shapes) = (Rc::clone(&self.base.store), Rc::clone(&self.base.shapes));
        let mns = (0..store.config().mns).map(|m| store.mn_node(m)).collect();
        let logs = LogRecovery::new(
            self.name.clone(),
            ctx.clone(),
            terminator,
            mns,
            plan,
            Rc::clone(&self.events),
            async move |c: &AnyContext, ids: &[u16]| {
                let mut done = Vec::new();
                for &id in ids {
                    let decided = recover_coordinator(c, &store, &shapes, id)
                        .await
                        .map_err(|e| e.to_string())?;
                    done.push((recovered(id, decided), c.now()));
                }
                Ok(done)
            },
        );
        let numbers = plan
            .members
            .iter()
            .filter_map(|m| Some((m.cn, plan.index_of(m.cn)?)))
            .collect();
        Ok(Some(Box::new(NoticeAfterLogs {
            name: self.name.clone(),
            logs,
            ctx,
            cluster,
            numbers,
            resend: plan.answer_timeout,
            events: Rc::clone(&self.events),
        })))
    }
}

/// A recovered coordinator as the run reports it and settles its history
/// ([`dmem_deploy::settle_history`]): the transaction of its newest whole commit log, rolled
/// forward or back; nothing logged aborts its undetermined transactions.
fn recovered(id: u16, decided: Decided) -> RecoveredCoordinator {
    let (txn, decision, restored) = match decided {
        Decided::Nothing => (None, None, 0),
        Decided::RolledForward { txn, cells, .. } => {
            (Some(txn.seq), Some(Decision::RollForward), cells)
        }
        Decided::RolledBack { txn, cells } => (Some(txn.seq), Some(Decision::RollBack), cells),
    };
    RecoveredCoordinator {
        coordinator: id,
        txn,
        decision,
        restored,
        unlocked: 0,
    }
}

/// LOTUS §6 across processes: `dmem-deploy`'s [`LogRecovery`] (heartbeat detector, link
/// termination at every MN, each coordinator's commit log decided), **then** the failure
/// notice ([`notify`], [`RequestKind::Release`]) to the lock server of every surviving CN,
/// which fences the failed CN in its table and releases the locks its lock states name
/// the failed CN as holder of. Only afterwards is the CN's recovery over: a lock released
/// before the logs are decided would let a survivor read around an INVISIBLE version that
/// recovery then makes visible.
struct NoticeAfterLogs<R> {
    name: String,
    logs: LogRecovery<R>,
    /// The detector's context: the survivors' replies to the notice come back here.
    ctx: AnyContext,
    /// The detector's CN's view of the lock service (every CN's lock-server endpoints).
    cluster: Rc<LockCluster>,
    /// Each member CN's LOTUS number.
    numbers: Vec<(NodeId, u16)>,
    /// How long the notice waits for a survivor's reply before sending it again.
    resend: Nanos,
    events: Rc<RefCell<Vec<RecoveryEvent>>>,
}

impl<R> ProcessRecovery for NoticeAfterLogs<R>
where
    R: AsyncFn(&AnyContext, &[u16]) -> Result<Vec<(RecoveredCoordinator, Nanos)>, String>,
{
    fn detect(&mut self) -> Result<Vec<NodeId>, DeployError> {
        self.logs.detect()
    }

    fn recover(&mut self, cn: NodeId) -> StepFuture<'_, ()> {
        Box::pin(async move {
            self.logs.recover(cn).await?;
            let Some(&(_, failed)) = self.numbers.iter().find(|(node, _)| *node == cn) else {
                return Ok(());
            };
            let survivors: Vec<u16> = self
                .numbers
                .iter()
                .map(|&(_, n)| n)
                .filter(|&n| n != failed)
                .collect();
            // The survivors' heartbeats arrive on this context too: they stay heartbeats.
            let logs = &mut self.logs;
            notify_passing(
                &self.ctx,
                &self.cluster,
                RequestKind::Release,
                failed,
                &survivors,
                self.resend,
                |msg| logs.heard_from(msg.from.node),
            )
            .await
            .map_err(|e| DeployError::Protocol {
                protocol: self.name.clone(),
                reason: format!("the failure notice of node {}: {e}", cn.0),
            })?;
            if let Some(event) = self.events.borrow_mut().iter_mut().rfind(|e| e.cn == cn) {
                event.finished_at = self.ctx.now();
            }
            Ok(())
        })
    }

    fn watch_mns(&mut self) -> StepFuture<'_, ()> {
        self.logs.watch_mns()
    }

    fn events(&self) -> Vec<RecoveryEvent> {
        self.logs.events()
    }

    fn settles_history(&self) -> bool {
        self.logs.settles_history()
    }
}

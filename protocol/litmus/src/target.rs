//! How a protocol plugs into the suite: [`LitmusTarget`], and [`FordTarget`] for FORD
//! (fixed or with bug switches) and Pandora.

use std::cell::RefCell;
use std::rc::Rc;

use dmem_ford::recovery::{heartbeat_loop, membership_listener};
use dmem_ford::{
    CnShared, FordCoordinator, LinkTerminator, Loader, Member, Protocol, ProtocolConfig,
    RecoveryEvent, RecoveryManager, Store, StoreConfig, TableSpec,
};
use dmem_layout::pill::CoordinatorId as PillId;
use dmem_sim::{Sim, SimContext};
use dmem_txn::{Coordinator, History, Key, TableId};
use dmem_verbs::{Nanos, NodeId, Verbs, VerbsError};

use crate::LitmusError;

/// What the suite asks a protocol to lay out on the simulated MNs.
#[derive(Debug, Clone)]
pub struct DeploySpec {
    /// The litmus table.
    pub table: TableId,
    /// Its value size.
    pub value_len: usize,
    /// Keys that may ever exist (loaded or inserted later).
    pub capacity: u64,
    /// Records present at the start, with their values.
    pub records: Vec<(Key, Vec<u8>)>,
    /// Coordinator ids the run will use (`0..coordinators`).
    pub coordinators: u16,
}

/// Timing of the failure detector (virtual ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryTiming {
    /// Heartbeat period of each worker CN.
    pub heartbeat: Nanos,
    /// Silence after which the detector suspects a CN.
    pub timeout: Nanos,
    /// Polling period of the detector and of the stray-lock listeners.
    pub poll: Nanos,
    /// When every background task stops.
    pub until: Nanos,
}

/// A protocol the litmus suite can run: it builds its store and coordinators on a
/// simulated cluster and runs its own failure handling, so the suite itself stays
/// protocol-agnostic (Motor, LOTUS, OOCC and Dandelion plug in here).
///
/// The suite calls, per run: [`deploy`](Self::deploy), [`coordinator`](Self::coordinator)
/// for every worker, [`start_recovery`](Self::start_recovery) once, runs the simulation
/// (with a crash injected), then [`final_coordinator`](Self::final_coordinator) for the
/// read-only assertion transaction.
pub trait LitmusTarget: Sync {
    /// The coordinator type.
    type Coordinator: Coordinator + 'static;
    /// Per-run state (store, membership, recovery events).
    type Deployment;

    /// A short name for reports (`pandora`, `ford`, `ford+covert-locks`).
    fn name(&self) -> String;

    /// Lays out the store on `sim`'s MNs, loads `spec.records` out of band and returns the
    /// run's deployment; transactions record into `history`.
    ///
    /// # Errors
    /// [`LitmusError`] if the store does not fit or a record does not load.
    fn deploy(
        &self,
        sim: &Rc<Sim>,
        spec: &DeploySpec,
        history: &Rc<RefCell<History>>,
    ) -> Result<Self::Deployment, LitmusError>;

    /// A worker coordinator with id `id` running on `ctx` (a context of a worker CN).
    ///
    /// # Errors
    /// [`LitmusError`] if the protocol has no room for `id`.
    fn coordinator(
        &self,
        dep: &mut Self::Deployment,
        ctx: SimContext,
        id: u16,
    ) -> Result<Self::Coordinator, LitmusError>;

    /// Starts the protocol's failure detection and recovery as simulated tasks: worker CNs
    /// report to a detector on `recovery_cn`, which recovers a CN that stops answering
    /// while the others keep running. Tasks stop at `timing.until`.
    ///
    /// # Errors
    /// [`LitmusError`] if a context cannot be made.
    fn start_recovery(
        &self,
        dep: &mut Self::Deployment,
        sim: &Rc<Sim>,
        recovery_cn: u16,
        timing: RecoveryTiming,
    ) -> Result<(), LitmusError>;

    /// The coordinator of the assertion's read-only transaction, on `ctx` (the recovery
    /// CN), after recovery: it knows which coordinators failed.
    ///
    /// # Errors
    /// [`LitmusError`] if the protocol has no room for `id`.
    fn final_coordinator(
        &self,
        dep: &mut Self::Deployment,
        ctx: SimContext,
        id: u16,
    ) -> Result<Self::Coordinator, LitmusError>;

    /// How many CN failures the protocol recovered in this run.
    fn recoveries(&self, dep: &Self::Deployment) -> usize;
}

/// FORD (fixed or with any of its six bugs, Pandora Table 1) or Pandora, from
/// `dmem-ford`. Recovery: the heartbeat failure detector and [`RecoveryManager`] (active
/// link termination, log recovery and truncation; FORD adds its stray-lock scan, Pandora
/// notifies survivors so PILL can steal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FordTarget {
    /// The protocol and its bug switches.
    pub config: ProtocolConfig,
}

impl FordTarget {
    /// A target running `config`.
    #[must_use]
    pub const fn new(config: ProtocolConfig) -> Self {
        Self { config }
    }
}

/// Link termination in the simulator: revoke the CN at the MN.
#[derive(Clone)]
pub struct SimLinkTerminator(pub Rc<Sim>);

impl core::fmt::Debug for SimLinkTerminator {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("SimLinkTerminator")
    }
}

impl LinkTerminator for SimLinkTerminator {
    async fn terminate(&self, mn: NodeId, cn: NodeId) -> Result<(), VerbsError> {
        self.0.revoke(mn, cn);
        Ok(())
    }
}

/// A FORD/Pandora deployment on one simulated cluster.
#[derive(Debug)]
pub struct FordDeployment {
    store: Rc<Store>,
    history: Rc<RefCell<History>>,
    /// Per CN: its shared state and its coordinator ids.
    cns: Vec<(NodeId, CnShared, Vec<u16>)>,
    events: Rc<RefCell<Vec<RecoveryEvent>>>,
}

impl FordDeployment {
    fn shared_of(&mut self, cn: NodeId) -> (CnShared, usize) {
        if let Some(i) = self.cns.iter().position(|(n, _, _)| *n == cn) {
            return (self.cns[i].1.clone(), i);
        }
        self.cns.push((cn, CnShared::new(), Vec::new()));
        (self.cns[self.cns.len() - 1].1.clone(), self.cns.len() - 1)
    }
}

impl LitmusTarget for FordTarget {
    type Coordinator = FordCoordinator<SimContext, Rc<RefCell<History>>>;
    type Deployment = FordDeployment;

    fn name(&self) -> String {
        match self.config.protocol {
            Protocol::Pandora => "pandora".to_owned(),
            Protocol::Ford if self.config.bugs.is_empty() => "ford".to_owned(),
            Protocol::Ford => {
                let bugs: Vec<&str> = dmem_ford::FordBug::ALL
                    .into_iter()
                    .filter(|b| self.config.bug(*b))
                    .map(dmem_ford::FordBug::name)
                    .collect();
                format!("ford+{}", bugs.join(","))
            }
        }
    }

    fn deploy(
        &self,
        sim: &Rc<Sim>,
        spec: &DeploySpec,
        history: &Rc<RefCell<History>>,
    ) -> Result<FordDeployment, LitmusError> {
        let mns = sim.mn_count();
        let regions = (0..mns).map(|i| sim.region(sim.mn(i))).collect();
        let cfg = StoreConfig::new(mns)
            .table(TableSpec::sized_for(
                spec.table,
                spec.value_len,
                spec.capacity,
                mns,
            ))
            .coordinators(spec.coordinators)
            .log_region_bytes(1024);
        let store = Rc::new(Store::new(cfg, regions)?);
        let mut loader = Loader::new(&store);
        for (key, value) in &spec.records {
            loader.load(spec.table, *key, value, |n, off, b| {
                sim.write_memory(n, off, b);
            })?;
        }
        Ok(FordDeployment {
            store,
            history: Rc::clone(history),
            cns: Vec::new(),
            events: Rc::new(RefCell::new(Vec::new())),
        })
    }

    fn coordinator(
        &self,
        dep: &mut FordDeployment,
        ctx: SimContext,
        id: u16,
    ) -> Result<Self::Coordinator, LitmusError> {
        let (shared, i) = dep.shared_of(ctx.node());
        dep.cns[i].2.push(id);
        Ok(FordCoordinator::new(
            ctx,
            Rc::clone(&dep.store),
            self.config,
            id,
            shared,
            Rc::clone(&dep.history),
        )?)
    }

    fn start_recovery(
        &self,
        dep: &mut FordDeployment,
        sim: &Rc<Sim>,
        recovery_cn: u16,
        timing: RecoveryTiming,
    ) -> Result<(), LitmusError> {
        let fd_ctx = sim.context(sim.cn(recovery_cn), 0)?;
        let detector = fd_ctx.local_endpoint();
        let mut members = Vec::new();
        for (cn, shared, ids) in &dep.cns {
            // Thread 1 of each worker CN runs its heartbeat and stray-lock listener.
            let listener = sim.context(*cn, 1)?;
            members.push(Member {
                cn: *cn,
                coordinators: ids.clone(),
                listener: listener.local_endpoint(),
            });
            let hb = sim.context(*cn, 1)?;
            let h = hb.clone();
            sim.spawn(&hb, async move {
                let _ = heartbeat_loop(&h, detector, timing.heartbeat, timing.until).await;
            });
            let failed = Rc::clone(&shared.failed);
            let l = listener.clone();
            sim.spawn(&listener, async move {
                let _ = membership_listener(&l, failed, timing.poll, timing.until).await;
            });
        }
        let mut manager = RecoveryManager::new(
            fd_ctx.clone(),
            Rc::clone(&dep.store),
            self.config.protocol,
            SimLinkTerminator(Rc::clone(sim)),
            members,
            timing.timeout,
        );
        dep.events = manager.events();
        sim.spawn(&fd_ctx, async move {
            // A recovery step that fails leaves the run to the assertion and the checker.
            let _ = manager.run(timing.until, timing.poll).await;
        });
        Ok(())
    }

    fn final_coordinator(
        &self,
        dep: &mut FordDeployment,
        ctx: SimContext,
        id: u16,
    ) -> Result<Self::Coordinator, LitmusError> {
        let shared = CnShared::new();
        for ev in dep.events.borrow().iter() {
            for c in &ev.coordinators {
                shared.failed.borrow_mut().insert(PillId(c.coordinator));
            }
        }
        Ok(FordCoordinator::new(
            ctx,
            Rc::clone(&dep.store),
            self.config,
            id,
            shared,
            Rc::clone(&dep.history),
        )?)
    }

    fn recoveries(&self, dep: &FordDeployment) -> usize {
        dep.events.borrow().len()
    }
}

//! FORD (fixed or with bug switches) and Pandora as a [`Protocol`], on the simulated cluster
//! or on a real fabric ([`MnMemory`]: an MN process loads its share, a CN process makes
//! coordinators on [`AnyContext`]s).
//!
//! Recovery is the heartbeat failure detector and [`RecoveryManager`] of `dmem-ford`
//! (Pandora §3.2.2: active-link termination, log recovery with roll forward / back and
//! truncation, stray-lock notification so PILL can steal); FORD adds its stop-the-world
//! stray-lock scan, during which [`Deployment::paused`] asks the survivors not to start
//! transactions (the paper's baseline stops the KVS, §6.1).

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use dmem_deploy::{
    AnyContext, Decision, DeployError, DeploySpec, Deployment, MnMemory, Protocol, Recorder,
    RecoveredCoordinator, RecoveryEvent, RecoveryTiming, SimLinkTerminator,
};
use dmem_ford::logic::Decision as FordDecision;
use dmem_ford::recovery::{heartbeat_loop, membership_listener};
use dmem_ford::{
    CnShared, FordCoordinator, FordTxn, LinkTerminator, Member, ProtocolConfig, RecoveryManager,
};
use dmem_layout::pill::{CoordinatorId as PillId, FailedCoordinatorSet, LockHolder, PillLockWord};
use dmem_layout::record::DataItem;
use dmem_sim::Sim;
use dmem_store::{BUCKET_LEN, BUCKET_SLOTS, Loader, Store, StoreConfig, parse_bucket};
use dmem_txn::{BoxCoordinator, Coordinator, Key, TableId, TxnError, TxnKind};
use dmem_verbs::{Clock, NodeId, Verbs, VerbsError};

/// FORD or Pandora under a registered name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FordProtocol {
    name: String,
    config: ProtocolConfig,
}

impl FordProtocol {
    /// `config` registered as `name`.
    #[must_use]
    pub fn new(name: &str, config: ProtocolConfig) -> Self {
        Self {
            name: name.to_owned(),
            config,
        }
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
        store_config(spec, mns)
    }
}

fn store_config(spec: &DeploySpec, mns: u16) -> StoreConfig {
    let layout = if spec.exact_index {
        StoreConfig::for_exact_tables
    } else {
        StoreConfig::for_tables
    };
    layout(
        mns,
        &spec.tables,
        spec.coordinators,
        spec.log_region_bytes,
        spec.index_slack,
    )
    // FORD and Pandora follow the address in an index slot, so sparse tables keep their
    // records in a pool apart from the slots.
    .with_sparse_indexes(&spec.tables, spec.direct_tables())
}

impl Protocol for FordProtocol {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn mn_bytes_per_mn(&self, spec: &DeploySpec, mns: u16) -> Result<u64, DeployError> {
        Ok(store_config(spec, mns).bytes_per_mn()?)
    }

    fn deploy_on(
        &self,
        memory: MnMemory,
        spec: &DeploySpec,
        history: Recorder,
    ) -> Result<Box<dyn Deployment>, DeployError> {
        let mns = memory.mn_count();
        let store = Rc::new(Store::new(store_config(spec, mns), memory.regions())?);
        Ok(Box::new(FordDeployment {
            name: self.name.clone(),
            config: self.config,
            memory,
            loader: Loader::shared(Rc::clone(&store)),
            store,
            history,
            cns: Vec::new(),
            warm: spec.warm_cache,
            events: Rc::new(RefCell::new(Vec::new())),
            error: Rc::new(RefCell::new(None)),
            paused: Rc::new(Cell::new(false)),
            steals: Rc::new(Cell::new(0)),
        }))
    }
}

/// FORD/Pandora on one cluster. [`ford_view`] reaches it through a [`Deployment`], for a
/// command that runs Pandora's recovery across processes itself.
pub struct FordDeployment {
    name: String,
    config: ProtocolConfig,
    memory: MnMemory,
    store: Rc<Store>,
    loader: Loader<'static>,
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
            shared
                .cache
                .borrow_mut()
                .warm_from(Rc::clone(&self.store), self.loader.loaded());
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
        let inner = FordCoordinator::new(
            ctx,
            Rc::clone(&self.store),
            self.config,
            id,
            shared,
            self.history.clone(),
        )?;
        Ok(Box::new(Counted {
            inner,
            steals: Rc::clone(&self.steals),
        }))
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

impl Deployment for FordDeployment {
    fn load(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), DeployError> {
        let loader = &mut self.loader;
        self.memory
            .loading(|write| loader.load(table, key, value, write))?;
        Ok(())
    }

    fn coordinator(&mut self, ctx: AnyContext, id: u16) -> Result<BoxCoordinator, DeployError> {
        let i = self.shared_of(ctx.node());
        self.cns[i].2.push(id);
        let shared = self.cns[i].1.clone();
        self.make(ctx, id, shared)
    }

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
            // Thread 1 of each worker CN (thread 0 if it has one) runs its heartbeat and
            // its stray-lock listener, beside the coordinators.
            let thread_ctx = || sim.context(*cn, 1).or_else(|_| sim.context(*cn, 0));
            let listener = thread_ctx()?;
            members.push(Member {
                cn: *cn,
                coordinators: ids.clone(),
                listener: listener.local_endpoint(),
            });
            let hb = thread_ctx()?;
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
            Rc::clone(&self.store),
            self.config.protocol,
            Terminator(SimLinkTerminator(Rc::clone(sim))),
            members,
            timing.timeout,
        );
        self.events = manager.events();
        let stop_the_world = self.config.protocol == dmem_ford::Protocol::Ford;
        let (paused, error) = (Rc::clone(&self.paused), Rc::clone(&self.error));
        let clock = fd_ctx.clone();
        sim.spawn(&fd_ctx, async move {
            // `RecoveryManager::run`, with FORD's stop-the-world pause around its recovery.
            let r: Result<(), dmem_ford::RecoveryError> = async {
                while clock.now() < timing.until {
                    let suspects = manager.detect()?;
                    manager.check_mns().await?;
                    if stop_the_world && !suspects.is_empty() {
                        paused.set(true);
                    }
                    for member in suspects {
                        manager.recover(member).await?;
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

    fn recovery_events(&self) -> Vec<RecoveryEvent> {
        let decision = |d: FordDecision| match d {
            FordDecision::RollForward => Decision::RollForward,
            FordDecision::RollBack => Decision::RollBack,
        };
        self.events
            .borrow()
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

    fn recovery_error(&self) -> Option<String> {
        self.error.borrow().clone()
    }

    fn paused(&self) -> Rc<Cell<bool>> {
        Rc::clone(&self.paused)
    }

    fn read_final(&self, table: TableId, key: Key) -> Option<Vec<u8>> {
        read_record_past_stray(&self.memory, &self.store, table, key, &self.failed())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
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

    fn counter(&self, name: &str) -> Option<u64> {
        (name == "steals").then(|| self.steals.get())
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
    let bytes = memory.read(node, bucket.offset, BUCKET_LEN)?;
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

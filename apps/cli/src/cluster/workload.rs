//! A CN's workload: the closed loops of its coordinators. For a transaction workload each
//! core of the CN makes its own deployment and coordinators ([`CnSetup`]) and runs them
//! for the workload's duration, counting into the CN's tallies ([`CnShared`]); the first
//! CN reads the final state and checks the workload's invariants ([`check_invariants`]).
//! For the verbs-level `faa` workload every post list carries, for every MN, `batch`
//! pairs of FAAs ([`faa_client`]): one on the CN's own word, one on the MN's shared word.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use dmem_deploy::process::{CoreGroup, ProcessPlan, ServiceContext, ports, services_of_core};
use dmem_deploy::{AnyContext, Deployment, MnMemory, Recorder};
use dmem_runtime::{CoreClock, RealClock};
use dmem_txn::{Coordinator, Transaction, TxnKind};
use dmem_verbs::{Clock, Nanos, NodeId, Port, PostList, RemoteAddr, Verbs, VerbsError};
use dmem_workloads::{AnyWorkload, Executed, Outcome, TxnGenerator, TxnInfo as _, Workload};
use hdrhistogram::Histogram;

use super::config::{Cluster, CnNode};
use super::history::StdoutHistory;
use super::net::Net;
use super::setup::TxnSetup;

/// How long a peer may leave a control request unanswered (a link termination, an
/// MN-failure acknowledgement) before recovery reports it.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// The recovery plan every process of `cluster` derives (`dmem-deploy`'s
/// [`ProcessPlan`]): every CN with its coordinators and listener, the first CN's detector.
/// A CN serves one service endpoint per client (LOTUS's lock servers); a server of a
/// symmetric protocol one, its message loop (`Protocol::deploy_server`).
fn process_plan(cluster: &Cluster) -> ProcessPlan {
    let services = if cluster.symmetric() {
        1
    } else {
        u16::try_from(cluster.clients()).expect("clients checked against ports::MAX_CLIENTS")
    };
    ProcessPlan::on_ports(
        cluster
            .cns()
            .iter()
            .map(|c| (c.node, cluster.coordinator_ids(c.node))),
        services,
        cluster.heartbeat(),
        cluster.timeout(),
        ANSWER_TIMEOUT.as_nanos() as u64,
        cluster.state_dir(),
    )
}

/// What the cores of one CN process share: the tallies over all its coordinators, how
/// many still run, and whether every core has made its coordinators.
#[derive(Debug, Default)]
pub(crate) struct CnShared {
    pub(crate) committed: AtomicU64,
    pub(crate) rolled_back: AtomicU64,
    pub(crate) failed: AtomicU64,
    /// Failed attempts by reason, over every core.
    pub(crate) aborts: Mutex<BTreeMap<String, u64>>,
    /// Transactions given up, by their last error.
    pub(crate) given_up: Mutex<BTreeMap<String, u64>>,
    /// The workload's conserved quantity the CN's commits added.
    pub(crate) delta: AtomicI64,
    /// Coordinators still running, on every core.
    pub(crate) running: AtomicUsize,
    /// Cores (other than the first) whose coordinators are made.
    pub(crate) built: AtomicUsize,
    /// Every CN has joined: the coordinators run from now on (a coordinator started earlier
    /// would ask a CN still starting for its services — LOTUS's locks — and fail).
    pub(crate) started: AtomicBool,
    /// A core could not make its coordinators, or the first core gave up: every core stops.
    pub(crate) stop: AtomicBool,
    /// Per core, the MNs its deployment's view counted as failed when its coordinators
    /// were done.
    pub(crate) failed_mns_by_core: Mutex<Vec<Vec<String>>>,
    /// Cores whose deployment ran the loader itself (no shared placement).
    pub(crate) core_loads: AtomicU64,
    /// Tries made (every attempt of every transaction), over every core.
    pub(crate) tries: AtomicU64,
    /// Latency of each committed transaction (first begin to commit, retries included), ns.
    pub(crate) latency: Mutex<Option<Histogram<u64>>>,
    /// Committed transactions per type name.
    pub(crate) committed_per_type: Mutex<BTreeMap<String, u64>>,
    /// The coordinators' window on this process's `CLOCK_MONOTONIC`: the first core's
    /// start and the last coordinator's end, ns.
    pub(crate) window: Mutex<(Option<Nanos>, Option<Nanos>)>,
}

impl CnShared {
    /// The coordinators' window, ns (0 if they never ran).
    pub(crate) fn window_ns(&self) -> u64 {
        match *lock(&self.window) {
            (Some(start), Some(end)) => end.saturating_sub(start),
            _ => 0,
        }
    }

    /// The latency histogram as `(value ns, count)` per recorded bucket, for the report.
    pub(crate) fn latency_buckets(&self) -> Vec<(u64, u64)> {
        lock(&self.latency).as_ref().map_or_else(Vec::new, |h| {
            h.iter_recorded()
                .map(|v| (v.value_iterated_to(), v.count_at_value()))
                .collect()
        })
    }
}

/// `mutex`'s tally; one poisoned by a panicking core is still counted.
pub(crate) use dmem_verbs::sync::lock_ignoring_poison as lock;

/// Everything a CN's cores need, shared by their threads.
pub(crate) struct CnSetup {
    pub(crate) cluster: Cluster,
    pub(crate) me: CnNode,
    pub(crate) setup: TxnSetup,
    pub(crate) plan: ProcessPlan,
    pub(crate) net: Net,
    /// Per core, the CPU its executor is pinned to (glommio) and its clients: `(client
    /// index, coordinator id)` (the client index numbers its port).
    pub(crate) cores: Vec<(usize, Vec<(u16, u16)>)>,
    /// What the cores' deployments share (`ProcessDeployment::join_core`).
    pub(crate) group: CoreGroup,
    pub(crate) shared: CnShared,
}

impl CnSetup {
    /// Deals this CN's clients out to `cluster.threads()` cores (client `c` on core `c mod
    /// threads`, each core's executor pinned to CPU `core mod CPUs`), with the recovery
    /// plan every process derives and the tallies the cores share.
    pub(crate) fn new(
        cluster: &Cluster,
        me: &CnNode,
        setup: &TxnSetup,
        net: Net,
    ) -> anyhow::Result<Self> {
        let threads = cluster.threads() as usize;
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let mut cores: Vec<(usize, Vec<(u16, u16)>)> =
            (0..threads).map(|t| (t % cpus, Vec::new())).collect();
        for (client, id) in cluster.coordinator_ids(me.node).into_iter().enumerate() {
            let client = u16::try_from(client).context("clients checked against ports")?;
            cores[usize::from(client) % threads].1.push((client, id));
        }
        Ok(CnSetup {
            cluster: cluster.clone(),
            me: me.clone(),
            setup: setup.clone(),
            plan: process_plan(cluster),
            net,
            shared: CnShared {
                running: AtomicUsize::new(cores.iter().map(|c| c.1.len()).sum()),
                failed_mns_by_core: Mutex::new(vec![Vec::new(); threads]),
                latency: Mutex::new(Some(
                    Histogram::new_with_bounds(1, 60_000_000_000, 3)
                        .context("a latency histogram")?,
                )),
                ..CnShared::default()
            },
            group: CoreGroup::new(threads),
            cores,
        })
    }

    /// This core's deployment (the protocol on the regions alone, streaming its records to
    /// stdout), after the loader ran without writing (so that placement decided while
    /// loading, such as OOCC's directory, agrees with the MNs) and
    /// `ProcessDeployment::join_as_cn` told it which CN it is (LOTUS: whose lock table it serves)
    /// and `ProcessDeployment::join_core` which core (Pandora: its listener's messages reach it).
    ///
    /// A protocol that takes a placement (`Protocol::deploy_placed`) gets the one the dry run
    /// of `TxnSetup::new` found, shared by every core, and the loader runs once per process.
    ///
    /// A server of a symmetric protocol deploys its own server instead
    /// (`Protocol::deploy_server`), its message loop on `services` (the plan's service
    /// endpoints of every server), and loads the records it holds.
    pub(crate) fn deployment(
        &self,
        core: usize,
        history: Recorder,
        services: &[ServiceContext],
    ) -> anyhow::Result<Box<dyn Deployment>> {
        let setup = &self.setup;
        if setup.protocol.symmetric() {
            let me = self
                .plan
                .index_of(self.me.node)
                .context("a server of the cluster")?;
            let servers = self
                .plan
                .members
                .iter()
                .map(|m| m.services.clone())
                .collect();
            let mut deployment = setup.protocol.deploy_server(
                me,
                servers,
                services.iter().map(|s| s.ctx.clone()).collect(),
                history,
            )?;
            for (table, key, value) in setup.workload.loader() {
                deployment.load(table, key, &value)?;
            }
            dmem_deploy::require_processes(&mut *deployment, &setup.protocol.name())?
                .join_as_cn(self.me.node, &self.plan)?;
            return Ok(deployment);
        }
        let memory = MnMemory::remote(setup.regions.clone());
        let placed = setup.placement.as_ref().and_then(|placement| {
            setup
                .protocol
                .deploy_placed(memory.clone(), &setup.spec, history.clone(), placement)
        });
        let mut deployment = match placed {
            Some(deployment) => deployment?,
            None => {
                self.shared.core_loads.fetch_add(1, Ordering::Relaxed);
                let mut deployment = setup.deploy(memory, history)?;
                for (table, key, value) in setup.workload.loader() {
                    deployment.load(table, key, &value)?;
                }
                deployment
            }
        };
        let side = dmem_deploy::require_processes(&mut *deployment, &setup.protocol.name())?;
        side.join_as_cn(self.me.node, &self.plan)?;
        side.join_core(self.group.on_core(core))?;
        Ok(deployment)
    }

    /// Contexts for core `core`'s share of the services this CN offers (LOTUS's lock
    /// servers: the `i`-th on the core of the `i`-th coordinator,
    /// `dmem_deploy::process::service_core`).
    pub(crate) fn services(&self, core: usize) -> anyhow::Result<Vec<ServiceContext>> {
        let services = self
            .plan
            .member(self.me.node)
            .map(|m| m.services.clone())
            .unwrap_or_default();
        services_of_core(&services, core, self.cores.len())
            .into_iter()
            .map(|(slot, e)| {
                Ok(ServiceContext {
                    slot,
                    ctx: self.net.context(self.me.node, e.port)?,
                })
            })
            .collect()
    }

    /// Core `core`'s coordinators, each on a context of its own connected to every MN.
    pub(crate) fn coordinators(
        &self,
        core: usize,
        deployment: &mut dyn Deployment,
    ) -> anyhow::Result<Vec<(u16, dmem_txn::BoxCoordinator, AnyContext)>> {
        let deadline = Instant::now() + self.cluster.join_timeout();
        let mut coordinators = Vec::new();
        for &(client, id) in &self.cores[core].1 {
            let ctx = self.net.connected(
                self.me.node,
                Port(ports::FIRST_COORDINATOR + client),
                &self.cluster,
                deadline,
            )?;
            let co = deployment.coordinator(ctx.clone(), id)?;
            coordinators.push((id, co, ctx));
        }
        Ok(coordinators)
    }

    /// Runs `coordinators` for the workload's duration from now (or until every core is
    /// told to stop), counting into the CN's tallies.
    pub(crate) async fn run_coordinators(
        &self,
        core: usize,
        coordinators: Vec<(u16, dmem_txn::BoxCoordinator, AnyContext)>,
        deployment: &RefCell<Box<dyn Deployment>>,
    ) {
        // Once every CN has joined (the first core says so), for the workload's duration.
        while !self.shared.started.load(Ordering::Relaxed) {
            if self.shared.stop.load(Ordering::Relaxed) {
                self.shared
                    .running
                    .fetch_sub(coordinators.len(), Ordering::Relaxed);
                return;
            }
            RealClock.sleep(1_000_000).await;
        }
        let start = dmem_runtime::monotonic_now();
        {
            let mut window = lock(&self.shared.window);
            window.0 = Some(window.0.map_or(start, |s| s.min(start)));
        }
        let end = start + self.cluster.duration().as_nanos() as u64;
        let clients = coordinators
            .into_iter()
            .map(|(id, co, ctx)| self.run_client(id, co, ctx, end, deployment));
        futures_util::future::join_all(clients).await;
        let finished = dmem_runtime::monotonic_now();
        {
            let mut window = lock(&self.shared.window);
            window.1 = Some(window.1.map_or(finished, |e| e.max(finished)));
        }
        let failed = failed_mns(deployment);
        lock(&self.shared.failed_mns_by_core)[core] =
            failed.iter().map(|&mn| self.cluster.mn_name(mn)).collect();
    }

    /// Coordinator `id`'s closed loop of the workload's transactions until `end` (or until
    /// every core is told to stop, or it lost a live MN), counting into the CN's tallies.
    async fn run_client(
        &self,
        id: u16,
        co: dmem_txn::BoxCoordinator,
        ctx: AnyContext,
        end: Nanos,
        deployment: &RefCell<Box<dyn Deployment>>,
    ) {
        let workload = &self.setup.workload;
        let shared = &self.shared;
        let attempts = self.cluster.attempts();
        // A core is one cooperative executor: the holder of what an attempt was
        // refused runs before the next try.
        let mut co = dmem_harness::YieldingBegin(co);
        let mut generator = workload.generator(u32::from(id), 0x5eed ^ u64::from(id));
        let mut pause = dmem_harness::BackoffPause::new(
            self.cluster.backoff(),
            RealClock,
            0x5eed,
            id,
            std::rc::Rc::default(),
        );
        while RealClock.now() < end && !shared.stop.load(Ordering::Relaxed) {
            let txn = generator.next_txn();
            let began = dmem_runtime::monotonic_now();
            let (executed, reasons) =
                dmem_harness::execute_with_reasons(workload, &mut co, &txn, attempts, &mut pause)
                    .await;
            let finished = dmem_runtime::monotonic_now();
            if !reasons.is_empty() {
                let mut aborts = lock(&shared.aborts);
                for reason in reasons {
                    *aborts.entry(reason).or_default() += 1;
                }
            }
            let tries = match &executed {
                Executed::Committed { attempts, .. }
                | Executed::RolledBack { attempts, .. }
                | Executed::Failed { attempts, .. } => *attempts,
            };
            shared.tries.fetch_add(u64::from(tries), Ordering::Relaxed);
            match executed {
                Executed::Committed { outcome, .. } => {
                    shared.committed.fetch_add(1, Ordering::Relaxed);
                    if let Some(h) = lock(&shared.latency).as_mut() {
                        let _ = h.record(finished.saturating_sub(began).max(1));
                    }
                    if let Some(t) = workload.txn_types().get(txn.type_index()) {
                        *lock(&shared.committed_per_type)
                            .entry(t.name.to_owned())
                            .or_default() += 1;
                    }
                    if let Outcome::Commit { delta } = outcome {
                        shared.delta.fetch_add(delta, Ordering::Relaxed);
                    }
                }
                Executed::RolledBack { .. } => {
                    shared.rolled_back.fetch_add(1, Ordering::Relaxed);
                }
                Executed::Failed { error, .. } => {
                    shared.failed.fetch_add(1, Ordering::Relaxed);
                    *lock(&shared.given_up).entry(error.to_string()).or_default() += 1;
                    // Revoked (or an MN gone that the view does not count as failed):
                    // nothing this coordinator posts lands any more. An MN the view
                    // dropped (Pandora §3.2.5) is no longer posted to.
                    let failed = failed_mns(deployment);
                    if lost_live_mn(&ctx, &failed) {
                        break;
                    }
                }
            }
            // On shm every post completes on its first poll, so a transaction never
            // waits: without this the core's other futures (heartbeats, the detector,
            // the other coordinators) would not run until the workload ends.
            dmem_runtime::yield_now().await;
        }
        shared.running.fetch_sub(1, Ordering::Relaxed);
    }

    /// A core after the first: its own deployment and coordinators.
    pub(crate) async fn worker_core(&self, core: usize) -> anyhow::Result<()> {
        // The service contexts first (as on the first core): a request that arrives while
        // this core loads is queued, not dropped.
        let made = self.services(core).and_then(|services| {
            let mut d = self.deployment(
                core,
                Recorder::streaming(Rc::new(StdoutHistory::default())),
                &[],
            )?;
            let coordinators = self.coordinators(core, &mut *d)?;
            let tasks = dmem_deploy::require_processes(&mut *d, &self.setup.protocol.name())?
                .core_tasks(self.me.node, &self.plan, services)?;
            Ok((d, coordinators, tasks))
        });
        let (deployment, coordinators, tasks) = match made {
            Ok(made) => made,
            Err(e) => {
                self.shared.stop.store(true, Ordering::Relaxed);
                return Err(e.context(format!("{}: core {core}", self.me.name)));
            }
        };
        self.shared.built.fetch_add(1, Ordering::Relaxed);
        let deployment = RefCell::new(deployment);
        // The core's tasks (Pandora: its end of the CN listener; often none) stop with its
        // coordinators, and never end the core by themselves.
        let tasks = async {
            futures_util::future::join_all(tasks).await;
            std::future::pending::<()>().await;
        };
        let work = self.run_coordinators(core, coordinators, &deployment);
        futures_util::future::select(std::pin::pin!(work), std::pin::pin!(tasks)).await;
        Ok(())
    }
}

/// Whether `ctx` lost an MN that the view does not count as `failed` (revoked, or the MN
/// went away): nothing it posts there lands any more.
fn lost_live_mn(ctx: &AnyContext, failed: &[NodeId]) -> bool {
    match ctx {
        AnyContext::Tcp(c) => c
            .links()
            .any(|(region, _)| c.is_lost(region.node) && !failed.contains(&region.node)),
        AnyContext::Shm(c) => c
            .links()
            .any(|l| l.is_revoked() && !failed.contains(&l.region().node)),
        AnyContext::Sim(_) => false,
        #[cfg(feature = "rdma")]
        AnyContext::Rdma(c) => c.verbs().lost_peers().any(|node| !failed.contains(&node)),
    }
}

/// A client's targets at one MN: its CN's word and the shared word.
pub(crate) type Targets = (RemoteAddr, RemoteAddr);

/// One closed-loop client of the `faa` workload; returns its completed posts, or the error
/// that stopped it with the posts before it.
pub(crate) async fn faa_client<V: Verbs>(
    ctx: V,
    targets: Vec<Targets>,
    batch: u32,
    end: Instant,
) -> (u64, Option<VerbsError>) {
    let mut posts = 0;
    while Instant::now() < end {
        let mut list = PostList::with_capacity(targets.len() * batch as usize * 2);
        for &(own, shared) in &targets {
            for _ in 0..batch {
                list.faa(own, 1);
                list.faa(shared, 1);
            }
        }
        if let Err(e) = ctx.post(list).await {
            return (posts, Some(e));
        }
        posts += 1;
    }
    (posts, None)
}

/// The workload's invariants over the final state read by `last` (`delta`: the conserved
/// quantity every CN's commits added): `ok`, the violations, or why they could not be read.
///
/// The workload's check asks for records one by one and may ask for more depending on what
/// it read (TPC-C looks up the orders it inserted), through a synchronous callback; the
/// reads are transactions that must run on this core's executor beside its other futures
/// (LOTUS's lock servers). So the check runs over the records read so far, the records it
/// asked for and did not have are read (each by a read-only transaction, retried like the
/// workload's), and it runs again until it asks for nothing new; its last verdict stands.
pub(crate) async fn check_invariants(
    workload: &AnyWorkload,
    mut last: dmem_txn::BoxCoordinator,
    delta: i64,
    clock: CoreClock,
) -> String {
    // Retried after a randomized exponential wait (100 µs up to 20 ms, up to about 1 s over the
    // attempts): a read that aborts does so because something is slow — a DrTM read lease
    // (400 µs) runs out when the process or the MN's is descheduled between the lease's
    // CAS and the commit — and retrying at once met the same stall 64 times (CI, 2 CN
    // processes × 2 cores beside other tests).
    let mut pause = dmem_harness::BackoffPause::new(
        dmem_harness::Backoff::Exponential {
            base_ns: 100_000,
            cap_ns: 20_000_000,
        },
        clock,
        0,
        0,
        std::rc::Rc::default(),
    );
    let mut read: HashMap<(dmem_txn::TableId, dmem_txn::Key), Option<Vec<u8>>> = HashMap::new();
    loop {
        let missing = RefCell::new(Vec::new());
        let violations = workload.check(
            |table, key| match read.get(&(table, key)) {
                Some(value) => value.clone(),
                None => {
                    missing.borrow_mut().push((table, key));
                    None
                }
            },
            delta,
        );
        let missing = missing.into_inner();
        if missing.is_empty() {
            return dmem_harness::invariants_verdict(&violations);
        }
        for (table, key) in missing {
            let mut attempt = 0;
            let value = loop {
                if attempt > 0 {
                    dmem_workloads::Pause::before_retry(&mut pause, attempt).await;
                }
                let r = async {
                    let mut tx = last.begin(TxnKind::ReadOnly).await?;
                    let value = tx.read(table, key).await?;
                    tx.commit().await?;
                    Ok::<_, dmem_txn::TxnError>(value)
                }
                .await;
                attempt += 1;
                match r {
                    Err(e) if e.is_retryable() && attempt < dmem_harness::MAX_ATTEMPTS => {}
                    r => break r,
                }
            };
            match value {
                Ok(value) => {
                    read.insert((table, key), value);
                }
                Err(e) => return format!("could not read the final state: {e}"),
            }
        }
    }
}

/// The MNs `deployment`'s view counts as failed (`ProcessDeployment::failed_mns`; none for a
/// protocol without a CN-process side, which never reaches here).
pub(crate) fn failed_mns(deployment: &RefCell<Box<dyn Deployment>>) -> Vec<NodeId> {
    deployment
        .borrow_mut()
        .processes()
        .map_or_else(Vec::new, |side| side.failed_mns())
}

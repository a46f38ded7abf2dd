//! `dmem cn`: a compute-node process (and, through [`run_txn_cn`], the server process of
//! a symmetric protocol, `dmem server`).
//!
//! - `faa` workload: connects every client context to every MN, heartbeats to every MN's
//!   control endpoint (`dmem_deploy::process::alive_task`), runs the clients
//!   ([`faa_client`]), tells each MN it is done, and prints a JSON report.
//! - Transaction workloads: one executor per core (`threads` of the file; glommio pinned to
//!   the core or the polling executor, as `executor` resolves:
//!   `dmem_runtime::run_per_core`), each core with a deployment and coordinators of its own
//!   ([`CnSetup`]). The first core also runs the CN's process tasks (heartbeats to the first
//!   CN, which are also its join barrier; Pandora's CN listener; LOTUS's lock servers). The
//!   first CN drives the `ProcessRecovery` that `ProcessDeployment::process_recovery` returns
//!   until every other CN finished or was recovered, then reads the final state, checks
//!   the workload's invariants and tells the MNs to quit; the other CNs report "done" and
//!   serve until it says the run is over. Each CN streams its history as JSON.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context as _, bail, ensure};
use dmem_deploy::process::{
    CnContexts, MessageLinkTerminator, MnFailure, ProcessRecovery, alive_task, mn_control, ports,
};
use dmem_deploy::{AnyContext, Decision, Deployment, Recorder, RecoveryEvent};
use dmem_runtime::{CoreClock, Executor, ExecutorKind, run_per_core};
use dmem_tcp::{TcpContext, TcpFabric};
use dmem_verbs::{Clock, Nanos, NodeId, Port, Verbs};

use dmem_cli::common;

use super::config::{Cluster, CnNode, NodeArgs};
use super::control::{Control, print_ready};
use super::history::StdoutHistory;
use super::net::{Net, connect_retrying, endpoint, quit_mns};
use super::report::{CnReport, MnFailed, Recovered, TxnCnReport};
use super::setup::TxnSetup;
use super::workload::{CnSetup, Targets, check_invariants, faa_client, lock};

/// `dmem cn`.
pub(crate) fn run_cn(args: &NodeArgs) -> anyhow::Result<()> {
    let cluster = Cluster::load(&args.cluster)?;
    ensure!(
        !cluster.symmetric(),
        "node `{}`: this cluster's nodes are servers of a symmetric protocol (role = \"server\"): start them with `dmem server`",
        args.node
    );
    let me = cluster.cn(&args.node)?.clone();
    match TxnSetup::of(&cluster)? {
        Some(setup) => run_txn_cn(&cluster, &me, &setup),
        None => run_faa_cn(&cluster, &me),
    }
}

/// `dmem cn` for the `faa` workload: connects every client context to every MN,
/// heartbeats to every MN's control endpoint, runs the clients, tells each MN it is done,
/// and prints a JSON report.
fn run_faa_cn(cluster: &Cluster, me: &CnNode) -> anyhow::Result<()> {
    let my_index = cluster.cn_index(me.node).context("a CN of the cluster")?;
    let (executor_kind, executor_why) = cluster
        .executor()
        .resolve()
        .map_err(|e| anyhow::anyhow!("{}: {e}", me.name))?;
    let control = me.control()?;
    let fabric = TcpFabric::new(me.node);
    let _listener = fabric
        .listen(control)
        .with_context(|| format!("{}: cannot listen for messages on {control}", me.name))?;
    for mn in cluster.mns() {
        fabric.add_peer(mn.node, mn.control()?);
    }
    for cn in cluster.cns().iter().filter(|c| c.node != me.node) {
        fabric.add_peer(cn.node, cn.control()?);
    }
    let per_thread = connect_faa_clients(cluster, &fabric, my_index)?;
    // Heartbeats to every MN until the workload is over and the MNs were told.
    let heartbeats = MnHeartbeats::start(cluster, fabric.context(Port(0))?)?;
    // `dmem cluster` starts its kill timer once every CN is this far.
    print_ready(&me.name);
    let start = Instant::now();
    let results = run_faa_clients(
        executor_kind,
        per_thread,
        start + cluster.duration(),
        cluster.batch(),
    )
    .with_context(|| format!("{}: client threads", me.name))?;
    let elapsed = start.elapsed().as_secs_f64();
    let posts: u64 = results.iter().map(|(p, _)| p).sum();
    let errors: Vec<String> = results.into_iter().flat_map(|(_, e)| e).collect();
    // Tell every MN (before the heartbeats stop, so that it does not suspect this CN).
    let done_ctx = fabric.context(Port(1))?;
    let payload = Control::CnDone { tally: posts }.emit();
    let executor = Executor::new();
    for mn in cluster.mns() {
        if let Err(e) = executor.block_on(done_ctx.send(mn_control(mn.node), &payload)) {
            eprintln!(
                "dmem cn {}: cannot tell MN `{}` it is done: {e}",
                me.name, mn.name
            );
        }
    }
    heartbeats.stop();
    let report = CnReport {
        role: "cn".into(),
        name: me.name.clone(),
        node: me.node.0,
        posts,
        batch: cluster.batch(),
        posts_per_s: common::round(posts as f64 / elapsed.max(1e-9), 1),
        errors,
        executor: executor_kind.name().to_owned(),
        executor_why,
    };
    println!("{}", serde_json::to_string(&report)?);
    ensure!(
        report.errors.is_empty(),
        "{}: clients stopped on errors: {}",
        me.name,
        report.errors.join("; ")
    );
    Ok(())
}

/// Per client thread, its clients: each a context connected to every MN, with its
/// targets there.
type PerThread = Vec<Vec<(TcpContext, Vec<Targets>)>>;

/// Every client context of this CN connected to every MN (retrying while MNs start), with
/// its targets there, dealt out to the client threads.
fn connect_faa_clients(
    cluster: &Cluster,
    fabric: &TcpFabric,
    my_index: usize,
) -> anyhow::Result<PerThread> {
    let deadline = Instant::now() + cluster.join_timeout();
    let mut per_thread: PerThread = (0..cluster.threads()).map(|_| Vec::new()).collect();
    for c in 0..cluster.clients() {
        let mut ctx = fabric.context(Port(u16::try_from(c + 2).context("too many clients")?))?;
        let mut targets = Vec::new();
        for mn in cluster.mns() {
            connect_retrying(&mut ctx, mn, deadline)?;
            let region = ctx.region(mn.node).context("connected above")?;
            let own = region
                .at(Cluster::cn_word(my_index))
                .context("the MN's region is smaller than the cluster file says")?;
            targets.push((own, region.at(0).context("empty region")?));
        }
        per_thread[(c % cluster.threads()) as usize].push((ctx, targets));
    }
    Ok(per_thread)
}

/// Runs the `faa` clients until `end`, one executor per client thread: glommio pinned to a
/// core (the thread-per-core runtime), or the polling executor on a plain thread. Returns
/// per thread its posts and the errors that stopped clients.
fn run_faa_clients(
    executor_kind: ExecutorKind,
    per_thread: PerThread,
    end: Instant,
    batch: u32,
) -> anyhow::Result<Vec<(u64, Vec<String>)>> {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let jobs: Vec<_> = per_thread
        .into_iter()
        .enumerate()
        .map(|(t, clients)| {
            let job = move |_clock| async move {
                let outcomes = Rc::new(RefCell::new(Vec::new()));
                let tasks: Vec<_> = clients
                    .into_iter()
                    .map(|(ctx, targets)| {
                        let outcomes = Rc::clone(&outcomes);
                        async move {
                            let outcome = faa_client(ctx, targets, batch, end).await;
                            outcomes.borrow_mut().push(outcome);
                        }
                    })
                    .collect();
                futures_util::future::join_all(tasks).await;
                let outcomes = outcomes.borrow();
                (
                    outcomes.iter().map(|(p, _)| p).sum::<u64>(),
                    outcomes
                        .iter()
                        .filter_map(|(_, e)| e.as_ref().map(ToString::to_string))
                        .collect::<Vec<_>>(),
                )
            };
            (t % cpus, job)
        })
        .collect();
    Ok(run_per_core(executor_kind, jobs)?)
}

/// A `faa` CN's heartbeats to every MN, on a thread of their own.
struct MnHeartbeats {
    stop: Arc<Mutex<Option<dmem_runtime::StopHandle>>>,
    thread: std::thread::JoinHandle<()>,
}

impl MnHeartbeats {
    fn start(cluster: &Cluster, heartbeat_ctx: TcpContext) -> anyhow::Result<Self> {
        let stop = Arc::new(Mutex::new(None::<dmem_runtime::StopHandle>));
        let heartbeat_stop = Arc::clone(&stop);
        let mn_nodes: Vec<NodeId> = cluster.mns().iter().map(|m| m.node).collect();
        let period = cluster.heartbeat();
        let thread = std::thread::Builder::new()
            .name("dmem-cn-heartbeat".into())
            .spawn(move || {
                let executor = Executor::new();
                *lock(&heartbeat_stop) = Some(executor.stop_handle());
                // A send fails while the MN's control listener is not up yet, or once the
                // MN is gone (the workload reports that): `alive_task` tries again a period
                // later.
                let ctx = AnyContext::from(heartbeat_ctx);
                for mn in mn_nodes {
                    executor.spawn(alive_task(ctx.clone(), mn_control(mn), period));
                }
                executor.run();
            })
            .context("cannot start the heartbeat thread")?;
        Ok(Self { stop, thread })
    }

    /// Stops the heartbeats and waits for their thread.
    fn stop(self) {
        if let Some(stop) = lock(&self.stop).take() {
            stop.stop();
        }
        let _ = self.thread.join();
    }
}

/// `dmem cn` for a transaction workload: one executor per core (`threads` of the cluster
/// file, each on the executor `executor` picks: glommio pinned to the core, or the polling
/// executor), each core's coordinators made by a deployment of its own
/// (`ProcessDeployment::splits_across_cores`); the first core also runs the CN's process tasks,
/// the detector's side (first CN) and the final check.
pub(crate) fn run_txn_cn(cluster: &Cluster, me: &CnNode, setup: &TxnSetup) -> anyhow::Result<()> {
    let (kind, executor_why) = cluster
        .executor()
        .resolve()
        .map_err(|e| anyhow::anyhow!("{}: {e}", me.name))?;
    setup
        .check_threads(cluster.threads())
        .with_context(|| me.name.clone())?;
    let net = Net::new(cluster, &me.name, me.node, || me.control())?;
    let cn = Arc::new(CnSetup::new(cluster, me, setup, net)?);
    let jobs = cn
        .cores
        .iter()
        .enumerate()
        .map(|(core, &(cpu, _))| {
            let cn = Arc::clone(&cn);
            let job = move |clock: CoreClock| async move {
                if core == 0 {
                    let r = first_core(&cn, clock).await;
                    if r.is_err() {
                        cn.shared.stop.store(true, Ordering::Relaxed);
                    }
                    r.map(Some)
                } else {
                    cn.worker_core(core).await.map(|()| None)
                }
            };
            (cpu, job)
        })
        .collect();
    let results = run_per_core(kind, jobs).with_context(|| format!("{}: cores", me.name))?;
    let mut first = None;
    for r in results {
        if let Some(f) = r? {
            first = Some(f);
        }
    }
    let report = txn_cn_report(&cn, first.unwrap_or_default(), kind, executor_why);
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// What a transaction CN reports: its tallies over every core, and the first core's part.
fn txn_cn_report(
    cn: &CnSetup,
    first: FirstCore,
    kind: ExecutorKind,
    executor_why: Option<String>,
) -> TxnCnReport {
    let (cluster, me, shared) = (&cn.cluster, &cn.me, &cn.shared);
    TxnCnReport {
        role: cluster.cn_role().into(),
        name: me.name.clone(),
        committed: shared.committed.load(Ordering::Relaxed),
        rolled_back: shared.rolled_back.load(Ordering::Relaxed),
        failed: shared.failed.load(Ordering::Relaxed),
        delta: shared.delta.load(Ordering::Relaxed),
        attempts: cluster.attempts(),
        aborts: lock(&shared.aborts).clone(),
        given_up: lock(&shared.given_up).clone(),
        recovered: first.recovered,
        mn_failures: first.mn_failures,
        invariants: first.invariants,
        executor: kind.name().to_owned(),
        executor_why,
        threads: cluster.threads(),
        counters: first.counters,
        failed_mns_by_core: lock(&shared.failed_mns_by_core).clone(),
        core_loads: shared.core_loads.load(Ordering::Relaxed),
        tries: shared.tries.load(Ordering::Relaxed),
        window_ns: shared.window_ns(),
        latency_ns: shared.latency_buckets(),
        committed_per_type: lock(&shared.committed_per_type).clone(),
    }
}

/// What the first core of a CN reports besides the tallies.
#[derive(Default)]
struct FirstCore {
    recovered: Vec<Recovered>,
    mn_failures: Vec<MnFailed>,
    invariants: String,
    counters: BTreeMap<String, u64>,
}

/// The first core of a CN: its share of the coordinators, the CN's process tasks
/// (heartbeats, Pandora's listener, LOTUS's lock servers) and, on the first CN, the
/// detector's side and the final check; on the others, the "done" report.
async fn first_core(cn: &CnSetup, clock: CoreClock) -> anyhow::Result<FirstCore> {
    let (cluster, me, plan, net) = (&cn.cluster, &cn.me, &cn.plan, &cn.net);
    let detector_cn = plan.detector.node;
    let is_detector = me.node == detector_cn;
    let deadline = Instant::now() + cluster.join_timeout();
    // The detector's receive queue exists before anything else of this CN, so that no
    // heartbeat of a quicker CN is dropped while this one connects.
    let detector_ctx = if is_detector {
        Some(net.connected(me.node, ports::DETECTOR, cluster, deadline)?)
    } else {
        None
    };
    // So does the queue of "done" reports (and, on the other CNs, of the detector's "run
    // over"): a quick CN may finish before a slow first CN has joined.
    let done_ctx = net.context(me.node, ports::DONE)?;
    // Likewise the service contexts of this core (LOTUS's lock servers): a quicker CN's
    // first lock requests are queued, not dropped, while this one loads.
    let services = cn.services(0)?;
    // The coordinators stream every record to stdout (and keep none here).
    let stdout_history = StdoutHistory::default();
    let streaming_off = stdout_history.off_switch();
    let mut deployment =
        cn.deployment(0, Recorder::streaming(Rc::new(stdout_history)), &services)?;
    let coordinators = cn.coordinators(0, &mut *deployment)?;
    // The protocol's CN side (heartbeats to the detector, which are also its join barrier;
    // for protocols with recovery across processes their listener) runs until this
    // process ends.
    let tasks = dmem_deploy::require_processes(&mut *deployment, &cn.setup.protocol.name())?
        .process_tasks(
            me.node,
            CnContexts {
                heartbeat: net.context(me.node, ports::HEARTBEAT)?,
                listener: net.context(me.node, ports::LISTENER)?,
                services,
            },
            plan,
        )?;
    let deployment = RefCell::new(deployment);
    let body = first_core_duties(
        cn,
        clock,
        &deployment,
        &streaming_off,
        detector_ctx,
        &done_ctx,
    );
    let body = async {
        let r = body.await;
        if r.is_err() {
            // The coordinators may still wait for the start (or run): stop them.
            cn.shared.stop.store(true, Ordering::Relaxed);
        }
        r
    };
    let work = futures_util::future::join(cn.run_coordinators(0, coordinators, &deployment), body);
    // The process tasks never end by themselves: they stop with the work. They start once
    // every core made its coordinators and its service contexts: the first heartbeat is
    // this CN's join, after which other CNs may send to any core's services, and a message
    // to a port no context receives on yet is dropped.
    let tasks = async {
        while cn.shared.built.load(Ordering::Relaxed) + 1 < cn.cores.len()
            && !cn.shared.stop.load(Ordering::Relaxed)
        {
            clock.sleep(1_000_000).await;
        }
        futures_util::future::join_all(tasks).await
    };
    let mut first =
        match futures_util::future::select(std::pin::pin!(work), std::pin::pin!(tasks)).await {
            futures_util::future::Either::Left((((), first), _)) => first?,
            futures_util::future::Either::Right(_) => bail!("{}: the process tasks ended", me.name),
        };
    first.counters = deployment.borrow().counters().into_iter().collect();
    Ok(first)
}

/// The first core's part of the run's control, once its coordinators are made: on the
/// first CN, the join barrier, the start of every CN and the detector's side
/// ([`detector`]); on the others, the wait for the start and the "done" report.
async fn first_core_duties(
    cn: &CnSetup,
    clock: CoreClock,
    deployment: &RefCell<Box<dyn Deployment>>,
    streaming_off: &Cell<bool>,
    detector_ctx: Option<AnyContext>,
    done_ctx: &AnyContext,
) -> anyhow::Result<FirstCore> {
    let (cluster, me, plan) = (&cn.cluster, &cn.me, &cn.plan);
    // `dmem cluster` starts its kill timer once every CN is this far (every core made
    // its coordinators; the first CN: once it heard every CN's first heartbeat).
    while cn.shared.built.load(Ordering::Relaxed) + 1 < cn.cores.len() {
        ensure!(
            !cn.shared.stop.load(Ordering::Relaxed),
            "{}: a core could not make its coordinators",
            me.name
        );
        clock.sleep(1_000_000).await;
    }
    if let Some(detector_ctx) = detector_ctx {
        join(cluster, me, clock, &detector_ctx).await?;
        for other in plan.members.iter().map(|m| m.cn).filter(|&n| n != me.node) {
            done_ctx
                .send(endpoint(other, ports::DONE), &Control::Go.emit())
                .await
                .with_context(|| {
                    format!(
                        "{}: cannot tell {} to start",
                        me.name,
                        cluster.cn_name(other)
                    )
                })?;
        }
        cn.shared.started.store(true, Ordering::Relaxed);
        print_ready(&me.name);
        detector(cn, clock, deployment, streaming_off, detector_ctx, done_ctx).await
    } else {
        wait_for_go(cn, clock, done_ctx).await?;
        print_ready(&me.name);
        report_done(cn, clock, done_ctx).await?;
        Ok(FirstCore::default())
    }
}

/// A CN other than the first: waits until the first CN says every CN joined, then lets its
/// coordinators start.
async fn wait_for_go(cn: &CnSetup, clock: CoreClock, done_ctx: &AnyContext) -> anyhow::Result<()> {
    let (cluster, me) = (&cn.cluster, &cn.me);
    // The first CN waits up to a join timeout for the last CN's first heartbeat.
    let give_up = clock.now() + (cluster.join_timeout() * 2).as_nanos() as u64;
    loop {
        while let Some(msg) = done_ctx.try_recv()? {
            if Control::parse(&msg.payload) == Ok(Control::Go) {
                cn.shared.started.store(true, Ordering::Relaxed);
                return Ok(());
            }
        }
        ensure!(
            clock.now() < give_up,
            "{}: the first CN `{}` did not say every CN joined within {} ms",
            me.name,
            cluster.cns()[0].name,
            (cluster.join_timeout() * 2).as_millis()
        );
        clock.sleep(1_000_000).await;
    }
}

/// A CN other than the first, once its coordinators are done: report to the detector, then
/// serve the other CNs (the protocol's tasks keep running) until the detector says every CN
/// finished, or for at most a join timeout; the report is re-sent every heartbeat meanwhile
/// (the detector counts it once).
async fn report_done(cn: &CnSetup, clock: CoreClock, done_ctx: &AnyContext) -> anyhow::Result<()> {
    let (cluster, me, plan) = (&cn.cluster, &cn.me, &cn.plan);
    let detector = endpoint(plan.detector.node, ports::DONE);
    while cn.shared.running.load(Ordering::Relaxed) > 0 {
        clock.sleep(plan.heartbeat).await;
    }
    let done = Control::cn_done_delta(cn.shared.delta.load(Ordering::Relaxed)).emit();
    if let Err(e) = done_ctx.send(detector, &done).await {
        eprintln!(
            "dmem cn {}: cannot tell the detector it is done: {e}",
            me.name
        );
    }
    let linger_end = clock.now() + cluster.join_timeout().as_nanos() as u64;
    while clock.now() < linger_end {
        while let Some(msg) = done_ctx.try_recv()? {
            if Control::parse(&msg.payload) == Ok(Control::RunOver) {
                return Ok(());
            }
        }
        clock.sleep(plan.heartbeat).await;
        let _ = done_ctx.send(detector, &done).await;
    }
    eprintln!(
        "dmem cn {}: no word from the detector within {} ms that the run is over; exiting",
        me.name,
        cluster.join_timeout().as_millis()
    );
    Ok(())
}

/// The first CN's detector side, once every CN joined: collect the other CNs' "done"
/// reports, recover the CNs that fail (protocols with recovery across processes), tell the
/// others the run is over, read the final state and check the workload's invariants, and
/// tell the MNs to quit.
async fn detector(
    cn: &CnSetup,
    clock: CoreClock,
    deployment: &RefCell<Box<dyn Deployment>>,
    streaming_off: &Cell<bool>,
    detector_ctx: AnyContext,
    done_ctx: &AnyContext,
) -> anyhow::Result<FirstCore> {
    let (cluster, me, plan, net, setup) = (&cn.cluster, &cn.me, &cn.plan, &cn.net, &cn.setup);
    // A protocol with recovery across processes takes over the detector's context;
    // for others the heartbeats are only drained.
    let mut recovery =
        dmem_deploy::require_processes(&mut **deployment.borrow_mut(), &cn.setup.protocol.name())?
            .process_recovery(
                detector_ctx.clone(),
                MessageLinkTerminator::new(
                    net.context(me.node, ports::TERMINATOR)?,
                    plan.heartbeat,
                    plan.answer_timeout,
                ),
                plan,
            )?;
    let start = dmem_runtime::monotonic_now();
    let (deltas, finished) =
        await_every_cn(cn, clock, &mut recovery, &detector_ctx, done_ctx).await?;
    let (events, mn_events) = recovery
        .as_ref()
        .map_or_else(Default::default, |r| (r.events(), r.mn_failures()));
    let settles = recovery.as_ref().is_some_and(|r| r.settles_history());
    // The final state, read by one more coordinator that knows who failed (it reads
    // past the locks they left) and which MNs failed (it connects to the live ones and
    // reads their primaries), then the live MNs are told the run is over.
    streaming_off.set(true);
    let dead = super::workload::failed_mns(deployment);
    let final_ctx = net.connected_to(
        me.node,
        ports::FINAL_READER,
        cluster,
        Instant::now() + cluster.join_timeout(),
        |node| !dead.contains(&node),
    )?;
    let last = deployment
        .borrow_mut()
        .final_coordinator(final_ctx, cluster.coordinators())?;
    let invariants = if events.is_empty() {
        let delta = cn.shared.delta.load(Ordering::Relaxed) + deltas.values().sum::<i64>();
        check_invariants(&setup.workload, last, delta, clock).await
    } else {
        // A recovered CN's committed changes are not known here.
        "skipped (a CN was recovered)".to_owned()
    };
    // Every other CN may exit now, its records read (a server of a symmetric protocol
    // holds some): the finished ones serve nobody any more, and one recovered while alive
    // (a false suspicion) is told too; a dead one cannot be.
    for other in plan.members.iter().map(|m| m.cn).filter(|&n| n != me.node) {
        let told = done_ctx
            .send(endpoint(other, ports::DONE), &Control::RunOver.emit())
            .await;
        if let (Err(e), true) = (told, finished.contains(&other)) {
            eprintln!(
                "dmem cn {}: cannot tell {} the run is over: {e}",
                me.name,
                cluster.cn_name(other)
            );
        }
    }
    quit_mns(cluster, &net.context(me.node, ports::QUIT_SENDER)?, &dead).await;
    Ok(first_core_report(
        cluster, start, &events, &mn_events, settles, invariants,
    ))
}

/// The detector's wait for the other CNs: collects their "done" reports (with their
/// committed deltas) and recovers the CNs that fail (protocols with recovery across
/// processes; for the others the heartbeats are only drained), until this CN's
/// coordinators are done and every other CN finished or was recovered.
async fn await_every_cn(
    cn: &CnSetup,
    clock: CoreClock,
    recovery: &mut Option<Box<dyn ProcessRecovery>>,
    detector_ctx: &AnyContext,
    done_ctx: &AnyContext,
) -> anyhow::Result<(HashMap<NodeId, i64>, BTreeSet<NodeId>)> {
    let (cluster, me, plan, setup) = (&cn.cluster, &cn.me, &cn.plan, &cn.setup);
    // Without recovery a CN that never reports ends the run, after this long.
    let give_up = clock.now() + (cluster.duration() + cluster.join_timeout() * 2).as_nanos() as u64;
    let mut deltas: HashMap<NodeId, i64> = HashMap::new();
    let mut finished: BTreeSet<NodeId> = BTreeSet::new();
    let mut recovered: BTreeSet<NodeId> = BTreeSet::new();
    loop {
        while let Some(msg) = done_ctx.try_recv()? {
            if let Ok(Control::CnDone { tally }) = Control::parse(&msg.payload) {
                finished.insert(msg.from.node);
                deltas.insert(msg.from.node, tally.cast_signed());
            }
        }
        match recovery.as_mut() {
            Some(recovery) => {
                let mut admit = |failed| {
                    if finished.contains(&failed) {
                        return false;
                    }
                    eprintln!(
                        "dmem cn {}: {} missed its heartbeats for {} ms: recovering it",
                        me.name,
                        cluster.cn_name(failed),
                        cluster.timeout() / 1_000_000
                    );
                    recovered.insert(failed);
                    true
                };
                recovery.step(&mut admit).await?;
            }
            None => while detector_ctx.try_recv()?.is_some() {},
        }
        let pending: Vec<String> = plan
            .members
            .iter()
            .map(|m| m.cn)
            .filter(|n| *n != me.node && !finished.contains(n) && !recovered.contains(n))
            .map(|n| cluster.cn_name(n))
            .collect();
        if cn.shared.running.load(Ordering::Relaxed) == 0 && pending.is_empty() {
            return Ok((deltas, finished));
        }
        ensure!(
            recovery.is_some() || clock.now() < give_up,
            "{}: {} did not finish, and protocol `{}` has no recovery across processes",
            me.name,
            pending.join(", "),
            setup.protocol.name()
        );
        clock.sleep(plan.heartbeat / 2).await;
    }
}

/// The first CN's account of the failures it handled, in ms since `start` (its detector's
/// start), with the final state's `invariants` verdict.
fn first_core_report(
    cluster: &Cluster,
    start: Nanos,
    events: &[RecoveryEvent],
    mn_events: &[MnFailure],
    settles: bool,
    invariants: String,
) -> FirstCore {
    let since_start = |t: Nanos| t.saturating_sub(start) / 1_000_000;
    let mn_failures = mn_events
        .iter()
        .map(|e| MnFailed {
            mn: cluster.mn_name(e.mn),
            detected_ms: since_start(e.detected_at),
            resumed_ms: e.resumed_at.map(since_start),
        })
        .collect();
    let recovered = events
        .iter()
        .map(|e| Recovered {
            cn: cluster.cn_name(e.cn),
            coordinators: e.coordinators.iter().map(|c| c.coordinator).collect(),
            decisions: e
                .coordinators
                .iter()
                .map(|c| match c.decision {
                    Some(Decision::RollForward) => "roll-forward".into(),
                    Some(Decision::RollBack) => "roll-back".into(),
                    None => "none".into(),
                })
                .collect(),
            detected_ms: since_start(e.detected_at),
            txns: e.coordinators.iter().map(|c| c.txn).collect(),
            settle_at: settles.then_some(e.finished_at),
        })
        .collect();
    FirstCore {
        recovered,
        mn_failures,
        invariants,
        counters: BTreeMap::new(),
    }
}

/// The detector's join barrier: suspicion starts once every CN has sent its first
/// heartbeat (a CN still connecting its coordinators is not a failed one).
async fn join(
    cluster: &Cluster,
    me: &CnNode,
    clock: CoreClock,
    detector_ctx: &AnyContext,
) -> anyhow::Result<()> {
    let mut heard = BTreeSet::new();
    let join_end = clock.now() + cluster.join_timeout().as_nanos() as u64;
    while heard.len() < cluster.cns().len() {
        while let Some(msg) = detector_ctx.try_recv()? {
            heard.insert(msg.from.node);
        }
        if clock.now() > join_end {
            bail!(
                "{}: no heartbeat from {} within {} ms",
                me.name,
                cluster.cns_not_heard(|n| heard.contains(&n)),
                cluster.join_timeout().as_millis()
            );
        }
        clock.sleep(1_000_000).await;
    }
    Ok(())
}

//! Pandora's recovery on the tcp fabric: a CN crashes mid-run, the surviving CN's
//! detector revokes it at every tcp memory server, recovers its coordinators from their
//! logs, and the survivors keep committing with a clean checker.
//!
//! Both CNs are wired as `dmem cn` wires a CN process, through `dmem-deploy` alone:
//! `Protocol::deploy_on` on the tcp MNs' memory (the victim on the regions alone, its loader
//! run without writing), a [`ProcessPlan`] on the [`ports`] layout, `ProcessDeployment::join_as_cn`,
//! coordinators on `AnyContext`s, the CN's `ProcessDeployment::process_tasks` (heartbeats,
//! Pandora's CN listener) and, on the detector's CN, the `ProcessRecovery` that
//! `ProcessDeployment::process_recovery` returns, driven by `ProcessRecovery::step`, terminating
//! links through the MNs' control endpoints (`LocalCluster::answer_link_terminations`, as
//! `dmem mn` answers them). Transactions retry through `dmem_harness::execute_with_reasons`.
//! SmallBank on every fabric without a crash is in `tests/fabrics.rs`.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use dmem_deploy::process::{CnContexts, MessageLinkTerminator, ProcessPlan, ports};
use dmem_deploy::{AnyContext, Deployment, MnMemory, Recorder};
use dmem_harness::fabric::{Fabric, LocalCluster};
use dmem_harness::{MAX_ATTEMPTS, YieldingBegin, deploy_spec, execute_with_reasons, verdict};
use dmem_protocols::ford::ford_view;
use dmem_runtime::{Executor, RealClock};
use dmem_tcp::TcpFabric;
use dmem_txn::{BoxCoordinator, Coordinator, History, ReadReq, Transaction, TxnKind};
use dmem_verbs::{Clock, NodeId, Port};
use dmem_workloads::{AnyWorkload, Executed, RetryAtOnce, Scale, TxnGenerator, Workload};

const MNS: u16 = 2;
const COORDINATORS: u16 = 6;
const HEARTBEAT: u64 = 5_000_000;
const TIMEOUT: u64 = 100_000_000;
/// As `dmem cn`'s: how long an MN may leave a termination request unanswered.
const ANSWER_TIMEOUT: u64 = 5_000_000_000;

/// The plan every process of the cluster derives (`dmem cn`'s `process_plan`): each CN with
/// its coordinator ids, on the [`ports`] layout, the detector on the first CN.
fn plan(cns: [(NodeId, Vec<u16>); 2]) -> ProcessPlan {
    ProcessPlan::on_ports(
        cns,
        0,
        HEARTBEAT,
        TIMEOUT,
        ANSWER_TIMEOUT,
        std::env::temp_dir(),
    )
}

/// A CN process's deployment of `protocol` on `memory` (as `dmem cn` makes one): the
/// loader run (writing only where `memory` is mapped), then told which CN it is.
fn cn_deployment(
    memory: MnMemory,
    workload: &AnyWorkload,
    spec: &dmem_deploy::DeploySpec,
    history: &Rc<RefCell<History>>,
    me: NodeId,
    plan: &ProcessPlan,
) -> Box<dyn Deployment> {
    let mut deployment = dmem_protocols::registry()
        .get("pandora")
        .unwrap()
        .deploy_on(memory, spec, Recorder::new(Rc::clone(history)))
        .unwrap();
    for (table, key, value) in workload.loader() {
        deployment.load(table, key, &value).unwrap();
    }
    deployment
        .processes()
        .unwrap()
        .join_as_cn(me, plan)
        .unwrap();
    deployment
}

/// What a CN's clients counted.
#[derive(Default)]
struct Tally {
    /// Commits.
    committed: Cell<u64>,
    /// Commits after the detector recovered the victim.
    after_recovery: Cell<u64>,
    /// Failed attempts by reason.
    aborts: RefCell<BTreeMap<String, u64>>,
    /// Transactions given up with an error a retry could not cure (a protocol fault).
    faults: RefCell<Vec<String>>,
    /// Clients still running.
    running: Cell<usize>,
}

/// A client until `until`: the benchmarks' retry loop ([`execute_with_reasons`]); commits
/// after `recovered` is set are counted apart.
async fn client(
    workload: Rc<AnyWorkload>,
    co: BoxCoordinator,
    id: u16,
    until: u64,
    recovered: Rc<Cell<bool>>,
    tally: Rc<Tally>,
) {
    tally.running.set(tally.running.get() + 1);
    let mut co = YieldingBegin(co);
    let mut generator = workload.generator(u32::from(id), 13 ^ u64::from(id));
    while RealClock.now() < until {
        let txn = generator.next_txn();
        let (executed, reasons) =
            execute_with_reasons(&*workload, &mut co, &txn, MAX_ATTEMPTS, &mut RetryAtOnce).await;
        for reason in reasons {
            *tally.aborts.borrow_mut().entry(reason).or_default() += 1;
        }
        match executed {
            Executed::Committed { .. } => {
                tally.committed.set(tally.committed.get() + 1);
                if recovered.get() {
                    tally.after_recovery.set(tally.after_recovery.get() + 1);
                }
            }
            // Before recovery, records the victim left locked abort every attempt (no
            // stealing until the stray-lock notification): given up after MAX_ATTEMPTS.
            Executed::Failed { error, .. } if !error.is_retryable() => {
                tally.faults.borrow_mut().push(error.to_string());
            }
            _ => {}
        }
    }
    tally.running.set(tally.running.get() - 1);
}

/// Pandora §3.2 on the tcp fabric: a CN (its own thread, executor, contexts and
/// connections) crashes mid-run — its executor stops and everything it had in flight is
/// dropped, as a killed process's would be; the detector on the surviving CN notices the
/// missing heartbeats, revokes it at every MN through the MNs' control endpoints (which
/// shut its tcp connections down), recovers its coordinators from their logs and notifies
/// the survivors, which keep committing; the checker over both CNs' histories is clean.
#[test]
fn pandora_recovers_a_crashed_cn_on_tcp() {
    let protocol = dmem_protocols::registry().get("pandora").unwrap();
    let workload = AnyWorkload::new("smallbank", Scale::Tiny).unwrap();
    let mut spec = deploy_spec(&workload, COORDINATORS);
    // Room enough in the index for tiny SmallBank without `deploy_loaded`'s retries.
    spec.index_slack *= 2;
    let bytes = protocol.mn_bytes_per_mn(&spec, MNS).unwrap();
    let cluster = Rc::new(LocalCluster::new(Fabric::Tcp, MNS, 2, bytes, 1).unwrap());
    let addrs = cluster.server_addrs();
    let regions = cluster.memory().regions();
    let (survivor, victim) = (cluster.cn(0), cluster.cn(1));
    // Coordinators 0..3 on the survivor, 3..5 on the victim, 5 reads the final state.
    let survivor_ids: Vec<u16> = (0..3).collect();
    let victim_ids: Vec<u16> = (3..COORDINATORS - 1).collect();
    let plan = plan([
        (survivor, survivor_ids.clone()),
        (victim, victim_ids.clone()),
    ]);
    let keys: Vec<_> = workload.loader().map(|(t, k, _)| (t, k)).collect();

    // The victim CN on its own thread: its deployment on the regions alone, its process
    // tasks (heartbeats to the detector, the listener), coordinators 3..5; after 300 ms its
    // executor stops with everything in flight (the crash).
    // The surviving CN: it maps every MN, so its loader writes the records, before any CN
    // runs (as MN processes load theirs before they serve).
    let history = Rc::new(RefCell::new(History::new()));
    let mut deployment = cn_deployment(
        cluster.memory(),
        &workload,
        &spec,
        &history,
        survivor,
        &plan,
    );

    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let victim_thread = {
        let (regions, addrs, victim_ids, spec, plan) = (
            regions.clone(),
            addrs.clone(),
            victim_ids.clone(),
            spec.clone(),
            plan.clone(),
        );
        let survivor_addr = cluster.message_addr(0).unwrap();
        let started = started_tx;
        std::thread::spawn(move || {
            let workload = Rc::new(AnyWorkload::new("smallbank", Scale::Tiny).unwrap());
            let history = Rc::new(RefCell::new(History::new()));
            let mut deployment = cn_deployment(
                MnMemory::remote(regions),
                &workload,
                &spec,
                &history,
                victim,
                &plan,
            );
            let fabric = TcpFabric::new(victim);
            let _listener = fabric.listen("127.0.0.1:0".parse().unwrap()).unwrap();
            fabric.add_peer(survivor, survivor_addr);
            let executor = Executor::new();
            let tally = Rc::new(Tally::default());
            for (slot, &id) in (0..).zip(&victim_ids) {
                let mut ctx = fabric
                    .context(Port(ports::FIRST_COORDINATOR + slot))
                    .unwrap();
                for &a in &addrs {
                    ctx.connect(a).unwrap();
                }
                let co = deployment.coordinator(ctx.into(), id).unwrap();
                // Runs until the crash.
                executor.spawn(client(
                    Rc::clone(&workload),
                    co,
                    id,
                    u64::MAX,
                    Rc::default(),
                    Rc::clone(&tally),
                ));
            }
            let context = |port: Port| AnyContext::from(fabric.context(port).unwrap());
            let ctxs = CnContexts {
                heartbeat: context(ports::HEARTBEAT),
                listener: context(ports::LISTENER),
                services: Vec::new(),
            };
            for task in deployment
                .processes()
                .unwrap()
                .process_tasks(victim, ctxs, &plan)
                .unwrap()
            {
                executor.spawn(task);
            }
            // Up and heartbeating: `dmem cluster` starts its kill timer once every CN is.
            started.send(dmem_runtime::monotonic_now()).unwrap();
            executor.run_for(Duration::from_millis(300));
            drop(executor); // the crash: every task, context and connection is dropped
            drop(deployment);
            let history = Rc::try_unwrap(history)
                .expect("every coordinator was dropped with the executor")
                .into_inner();
            let faults = tally.faults.take();
            (history, tally.committed.get(), faults)
        })
    };

    // The survivors and the detector start once every CN is up (`dmem cn`'s join barrier: a
    // CN still starting is not a failed one).
    let victim_started = started_rx.recv().unwrap();
    let executor = Executor::new();
    let until = dmem_runtime::monotonic_now() + 1_500_000_000;
    let workload = Rc::new(workload);
    let recovered = Rc::new(Cell::new(false));
    let survivors = Rc::new(Tally::default());
    for (slot, &id) in (0..).zip(&survivor_ids) {
        let ctx = cluster.context(0, ports::FIRST_COORDINATOR + slot).unwrap();
        let co = deployment.coordinator(ctx, id).unwrap();
        executor.spawn(client(
            Rc::clone(&workload),
            co,
            id,
            until,
            Rc::clone(&recovered),
            Rc::clone(&survivors),
        ));
    }
    let ctxs = CnContexts {
        heartbeat: cluster.context(0, ports::HEARTBEAT.0).unwrap(),
        listener: cluster.context(0, ports::LISTENER.0).unwrap(),
        services: Vec::new(),
    };
    for task in deployment
        .processes()
        .unwrap()
        .process_tasks(survivor, ctxs, &plan)
        .unwrap()
    {
        executor.spawn(task);
    }
    // The MNs answer link terminations, as MN processes do.
    executor.spawn(cluster.answer_link_terminations(until).unwrap());
    // The detector, on the survivor, as `dmem cn`'s first CN drives it.
    let mut recovery = deployment
        .processes()
        .unwrap()
        .process_recovery(
            cluster.context(0, ports::DETECTOR.0).unwrap(),
            MessageLinkTerminator::new(
                cluster.context(0, ports::TERMINATOR.0).unwrap(),
                HEARTBEAT,
                ANSWER_TIMEOUT,
            ),
            &plan,
        )
        .unwrap()
        .expect("Pandora recovers across processes");
    let detector = {
        let recovered = Rc::clone(&recovered);
        async move {
            while RealClock.now() < until {
                if !recovery.step(&mut |_| true).await?.is_empty() {
                    recovered.set(true);
                }
                RealClock.sleep(HEARTBEAT / 2).await;
            }
            Ok::<_, dmem_deploy::DeployError>(recovery.events())
        }
    };
    // The process tasks run for ever: the run ends with the detector's loop.
    let events = executor.block_on(detector).expect("recovery failed");
    // The survivors' clients end at `until` too, once their transaction in flight is done.
    let clients = Rc::clone(&survivors);
    executor.block_on(async move {
        while clients.running.get() > 0 {
            RealClock.sleep(1_000_000).await;
        }
    });
    let (victim_history, victim_committed, victim_faults) = victim_thread.join().unwrap();
    assert!(
        victim_committed > 0,
        "the victim committed nothing before its crash"
    );
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].cn, victim);
    assert_eq!(
        events[0]
            .coordinators
            .iter()
            .map(|c| c.coordinator)
            .collect::<Vec<_>>(),
        victim_ids
    );
    // A transaction fails for good only on a fault, or on a victim cut off while still
    // running: on a loaded host its thread can be starved of heartbeats past the timeout
    // before its crash (a false suspicion, which recovery handles the same way).
    if events[0].detected_at >= victim_started + 300_000_000 {
        assert_eq!(victim_faults, Vec::<String>::new());
    } else {
        eprintln!("the victim was suspected before its crash (a loaded host): {victim_faults:?}");
    }
    assert!(
        events[0].detected_at <= events[0].terminated_at
            && events[0].terminated_at <= events[0].finished_at,
        "{events:?}"
    );
    // The deployment knows what its detector recovered (the final coordinator reads it).
    assert_eq!(deployment.sim_recovery().unwrap().recovery_events(), events);
    assert!(
        survivors.after_recovery.get() > 0,
        "the survivors committed nothing after recovery"
    );
    assert_eq!(*survivors.faults.borrow(), Vec::<String>::new());
    // The survivors' listener was told which coordinators failed.
    let failed = ford_view(&*deployment)
        .unwrap()
        .cn_shared(survivor)
        .unwrap()
        .failed;
    for &id in &victim_ids {
        assert!(
            failed
                .borrow()
                .contains(dmem_layout::pill::CoordinatorId(id)),
            "the listener was not told coordinator {id} failed"
        );
    }
    eprintln!(
        "victim committed {victim_committed}, in doubt {}; recovered {:?}; survivors committed {} after recovery, aborts {:?}",
        victim_history
            .txns
            .iter()
            .filter(|t| t.outcome == dmem_txn::TxnOutcome::Unknown)
            .count(),
        events[0].coordinators,
        survivors.after_recovery.get(),
        survivors.aborts.borrow()
    );
    // The victim's links are gone at every MN.
    for a in &addrs {
        let mut again = TcpFabric::new(victim).context(Port(1)).unwrap();
        assert!(again.connect(*a).is_err());
    }
    // Both CNs' histories together are strictly serializable.
    let mut all = history.borrow().clone();
    all.txns.extend(victim_history.txns);
    assert_eq!(verdict(&all), "ok");
    // Every record is still readable, past the locks the victim left (PILL): a coordinator
    // of the surviving CN, which the listener told who failed.
    let mut last = deployment
        .coordinator(
            cluster.context(0, ports::FINAL_READER.0).unwrap(),
            COORDINATORS - 1,
        )
        .unwrap();
    let expected = keys.len();
    let read = executor.block_on(async move {
        let mut read = 0;
        for chunk in keys.chunks(16) {
            let reqs: Vec<ReadReq> = chunk.iter().map(|&(t, k)| ReadReq::read(t, k)).collect();
            let mut tx = last.begin(TxnKind::ReadOnly).await.unwrap();
            read += tx.read_round(&reqs).await.unwrap().iter().flatten().count();
            tx.commit().await.unwrap();
        }
        read
    });
    assert_eq!(read, expected);
}

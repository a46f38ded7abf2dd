//! Pandora's recovery on the tcp fabric: a CN crashes mid-run, the surviving CN's
//! detector revokes it at every tcp memory server, recovers its coordinators from their
//! logs, and the survivors keep committing with a clean checker.
//!
//! Both CNs deploy Pandora through `dmem-deploy` (`Protocol::deploy_on` on the tcp MNs'
//! memory, coordinators on `AnyContext`s), as `dmem cn` does; SmallBank on every fabric
//! without a crash is in `tests/fabrics.rs`.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use dmem_deploy::{AnyContext, MnMemory, Recorder};
use dmem_harness::fabric::{Fabric, LocalCluster};
use dmem_harness::{MAX_ATTEMPTS, deploy_spec, verdict};
use dmem_protocols::ford::ford_view;
use dmem_runtime::Executor;
use dmem_tcp::TcpFabric;
use dmem_txn::{Coordinator, History, ReadReq, Transaction, TxnKind};
use dmem_verbs::{Endpoint, NodeId, Port};
use dmem_workloads::{AnyWorkload, Executed, Scale, TxnGenerator, Workload, execute};

const MNS: u16 = 2;
const COORDINATORS: u16 = 6;

/// The MNs of a run, Pandora's link terminator on them: revocation at the tcp memory server
/// (its connections shut down, its hellos refused, nothing of the CN lands afterwards).
struct TcpTerminator(Rc<LocalCluster>);

impl dmem_ford::LinkTerminator for TcpTerminator {
    async fn terminate(&self, mn: NodeId, cn: NodeId) -> Result<(), dmem_verbs::VerbsError> {
        self.0
            .revoke(mn.0, cn.0 - MNS)
            .map_err(|_| dmem_verbs::VerbsError::ConnectionLost { node: mn })
    }
}

/// Pandora §3.2 on the tcp fabric: a CN (its own thread, executor, contexts and
/// connections) crashes mid-run — its executor stops and everything it had in flight is
/// dropped, as a killed process's would be; the detector on the surviving CN notices the
/// missing heartbeats, revokes it at every MN through the tcp memory servers, recovers its
/// coordinators from their logs and notifies the survivors, which keep committing; the
/// checker over both CNs' histories is clean.
#[test]
fn pandora_recovers_a_crashed_cn_on_tcp() {
    use std::time::Duration;

    use dmem_ford::recovery::{heartbeat_loop, membership_listener};
    use dmem_ford::{Member, RecoveryManager};
    use dmem_verbs::Clock;

    const HEARTBEAT: u64 = 5_000_000;
    const TIMEOUT: u64 = 100_000_000;
    let protocol = dmem_protocols::registry().get("pandora").unwrap();
    let workload = AnyWorkload::new("smallbank", Scale::Tiny).unwrap();
    let mut spec = deploy_spec(&workload, COORDINATORS);
    // Room enough in the index for tiny SmallBank without `deploy_loaded`'s retries.
    spec.index_slack *= 2;
    let bytes = protocol.mn_bytes_per_mn(&spec, MNS).unwrap();
    let cluster = Rc::new(LocalCluster::new(Fabric::Tcp, MNS, 2, bytes, 1).unwrap());
    let addrs = cluster.server_addrs();
    let regions = cluster.memory().regions();
    // The surviving CN: coordinators 0..3, the detector, its stray-lock listener; it
    // deploys on every MN's memory and loads the records.
    let history = Rc::new(RefCell::new(History::new()));
    let mut deployment = protocol
        .deploy_on(cluster.memory(), &spec, Recorder::new(Rc::clone(&history)))
        .unwrap();
    let mut keys = Vec::new();
    for (table, key, value) in workload.loader() {
        deployment.load(table, key, &value).unwrap();
        keys.push((table, key));
    }
    let (survivor, victim) = (cluster.cn(0), cluster.cn(1));
    let survivor_ids: Vec<u16> = (0..3).collect();
    let victim_ids: Vec<u16> = (3..COORDINATORS - 1).collect();
    let detector = Endpoint {
        node: survivor,
        port: Port(100),
    };
    let notify = |node| Endpoint {
        node,
        port: Port(99),
    };

    // The victim CN on its own thread: it heartbeats, runs coordinators 3..5, and after
    // 300 ms its executor stops with everything in flight (the crash).
    let victim_thread = {
        let (regions, addrs, victim_ids, spec) = (
            regions.clone(),
            addrs.clone(),
            victim_ids.clone(),
            spec.clone(),
        );
        let survivor_addr = cluster.message_addr(0).unwrap();
        std::thread::spawn(move || {
            let workload = Rc::new(AnyWorkload::new("smallbank", Scale::Tiny).unwrap());
            // A CN process's deployment: the regions alone, nothing loaded here.
            let history = Rc::new(RefCell::new(History::new()));
            let mut deployment = dmem_protocols::registry()
                .get("pandora")
                .unwrap()
                .deploy_on(
                    MnMemory::remote(regions),
                    &spec,
                    Recorder::new(Rc::clone(&history)),
                )
                .unwrap();
            let fabric = TcpFabric::new(victim);
            let _listener = fabric.listen("127.0.0.1:0".parse().unwrap()).unwrap();
            fabric.add_peer(survivor, survivor_addr);
            let executor = Executor::new();
            let hb = AnyContext::from(fabric.context(Port(98)).unwrap());
            executor.spawn(async move {
                let _ = heartbeat_loop(&hb, detector, HEARTBEAT, u64::MAX).await;
            });
            let committed = Rc::new(Cell::new(0u64));
            for &id in &victim_ids {
                let mut ctx = fabric.context(Port(id + 1)).unwrap();
                for &a in &addrs {
                    ctx.connect(a).unwrap();
                }
                let mut co = deployment.coordinator(ctx.into(), id).unwrap();
                let (workload, committed) = (Rc::clone(&workload), Rc::clone(&committed));
                executor.spawn(async move {
                    let mut generator = workload.generator(u32::from(id), 11 ^ u64::from(id));
                    loop {
                        let txn = generator.next_txn();
                        if let Executed::Committed { .. } =
                            execute(&*workload, &mut co, &txn, MAX_ATTEMPTS).await
                        {
                            committed.set(committed.get() + 1);
                        }
                    }
                });
            }
            executor.run_for(Duration::from_millis(300));
            drop(executor); // the crash: every task, context and connection is dropped
            drop(deployment);
            let history = Rc::try_unwrap(history)
                .expect("every coordinator was dropped with the executor")
                .into_inner();
            (history, committed.get())
        })
    };

    let executor = Executor::new();
    let clock = dmem_runtime::RealClock;
    let start = dmem_runtime::monotonic_now();
    let until = start + 1_500_000_000;
    let members = vec![
        Member {
            cn: survivor,
            coordinators: survivor_ids.clone(),
            listener: notify(survivor),
        },
        Member {
            cn: victim,
            coordinators: victim_ids.clone(),
            listener: notify(victim),
        },
    ];
    // The detector reads and repairs logs and locks itself: it needs its own connections.
    let detector_ctx = cluster.context(0, detector.port.0).unwrap();
    let mut manager = RecoveryManager::new(
        detector_ctx,
        Rc::clone(ford_view(&*deployment).unwrap().store()),
        dmem_ford::Protocol::Pandora,
        TcpTerminator(Rc::clone(&cluster)),
        members,
        TIMEOUT,
    );
    let events = manager.events();
    let recovery_error = Rc::new(RefCell::new(None));
    {
        let recovery_error = Rc::clone(&recovery_error);
        executor.spawn(async move {
            if let Err(e) = manager.run(until, HEARTBEAT).await {
                *recovery_error.borrow_mut() = Some(e.to_string());
            }
        });
    }
    let hb = cluster.context(0, 98).unwrap();
    executor.spawn(async move {
        let _ = heartbeat_loop(&hb, detector, HEARTBEAT, until).await;
    });
    let workload = Rc::new(workload);
    let after_crash = Rc::new(Cell::new(0u64));
    for &id in &survivor_ids {
        let mut co = deployment
            .coordinator(cluster.context(0, id + 1).unwrap(), id)
            .unwrap();
        let (workload, after_crash, events) = (
            Rc::clone(&workload),
            Rc::clone(&after_crash),
            Rc::clone(&events),
        );
        executor.spawn(async move {
            let mut generator = workload.generator(u32::from(id), 13 ^ u64::from(id));
            while clock.now() < until {
                let txn = generator.next_txn();
                match execute(&*workload, &mut co, &txn, MAX_ATTEMPTS).await {
                    Executed::Committed { .. } if !events.borrow().is_empty() => {
                        after_crash.set(after_crash.get() + 1);
                    }
                    // Before recovery, records the victim left locked abort every attempt
                    // (no stealing until the stray-lock notification): given up, like the
                    // harness does after MAX_ATTEMPTS.
                    _ => {}
                }
            }
        });
    }
    // The survivors' stray-lock listener, on the state their coordinators share.
    let shared = ford_view(&*deployment)
        .unwrap()
        .cn_shared(survivor)
        .unwrap();
    let listen_ctx = cluster.context(0, notify(survivor).port.0).unwrap();
    let failed = Rc::clone(&shared.failed);
    executor.spawn(async move {
        let _ = membership_listener(&listen_ctx, failed, HEARTBEAT, until).await;
    });
    executor.run();
    let (victim_history, victim_committed) = victim_thread.join().unwrap();
    assert!(
        victim_committed > 0,
        "the victim committed nothing before its crash"
    );
    assert_eq!(*recovery_error.borrow(), None);
    let events = events.borrow();
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
    assert!(
        after_crash.get() > 0,
        "the survivors committed nothing after recovery"
    );
    eprintln!(
        "victim committed {victim_committed}, in doubt {}; recovered {:?}; survivors committed {} after recovery",
        victim_history
            .txns
            .iter()
            .filter(|t| t.outcome == dmem_txn::TxnOutcome::Unknown)
            .count(),
        events[0].coordinators,
        after_crash.get()
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
        .coordinator(cluster.context(0, 50).unwrap(), COORDINATORS - 1)
        .unwrap();
    let read = executor.block_on(async {
        let mut read = 0;
        for chunk in keys.chunks(16) {
            let reqs: Vec<ReadReq> = chunk.iter().map(|&(t, k)| ReadReq::read(t, k)).collect();
            let mut tx = last.begin(TxnKind::ReadOnly).await.unwrap();
            read += tx.read_round(&reqs).await.unwrap().iter().flatten().count();
            tx.commit().await.unwrap();
        }
        read
    });
    assert_eq!(read, keys.len());
}

//! FORD and Pandora run unchanged on the tcp fabric: SmallBank on MNs served over loopback
//! (`dmem-tcp`), coordinators on `TcpContext`s under the real-time executor, the history
//! checker and SmallBank's invariants over the result.
//!
//! The store is laid out and loaded by hand here because `dmem-deploy` builds deployments
//! on the simulator only; the protocol, the workload and the checker are the same code that
//! `dmem bench` runs there.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use dmem_ford::{CnShared, FordCoordinator, ProtocolConfig};
use dmem_harness::{MAX_ATTEMPTS, deploy_spec, verdict};
use dmem_runtime::{Clocked, Executor};
use dmem_shm::{ShmContext, ShmFabric, ShmMemoryNode};
use dmem_store::{Loader, Store, StoreConfig};
use dmem_tcp::{TcpFabric, TcpMemoryServer};
use dmem_txn::{Coordinator, History, Key, ReadReq, TableId, Transaction, TxnKind};
use dmem_verbs::{Endpoint, NodeId, Port, PostList, RKey};
use dmem_workloads::{AnyWorkload, Executed, Outcome, Scale, TxnGenerator, Workload, execute};

const MNS: u16 = 2;
const COORDINATORS: u16 = 6;
const TXNS_PER_COORDINATOR: usize = 150;

/// SmallBank laid out for FORD/Pandora on `MNS` tcp memory servers on loopback, loaded out
/// of band through a local shared-memory link to each MN's memory.
struct TcpSmallBank {
    workload: AnyWorkload,
    servers: Rc<Vec<TcpMemoryServer>>,
    store_config: StoreConfig,
    regions: Vec<dmem_verbs::MemoryRegion>,
    addrs: Vec<std::net::SocketAddr>,
    store: Rc<Store>,
    keys: Vec<(TableId, Key)>,
}

impl TcpSmallBank {
    fn new() -> Self {
        let workload = AnyWorkload::new("smallbank", Scale::Tiny).unwrap();
        let mut spec = deploy_spec(&workload, COORDINATORS);
        // Room enough in the index for tiny SmallBank without `deploy_loaded`'s retries.
        spec.index_slack *= 2;
        // The layout the simulator's deployment of FORD/Pandora uses (the same for both).
        let store_config = dmem_protocols::FordProtocol::new("pandora", ProtocolConfig::pandora())
            .store_config(&spec, MNS);
        let bytes = store_config.bytes_per_mn().unwrap();
        let servers: Vec<TcpMemoryServer> = (0..MNS)
            .map(|i| {
                let mn =
                    ShmMemoryNode::create(NodeId(i), RKey(0x5eed + u32::from(i)), bytes).unwrap();
                TcpMemoryServer::serve(mn, "127.0.0.1:0".parse().unwrap()).unwrap()
            })
            .collect();
        let regions: Vec<_> = servers.iter().map(TcpMemoryServer::region).collect();
        let addrs = servers.iter().map(TcpMemoryServer::local_addr).collect();
        let store = Rc::new(Store::new(store_config.clone(), regions.clone()).unwrap());
        let loader_fabric = ShmFabric::new();
        let local: Vec<ShmContext> = servers
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let node = NodeId(100 + i as u16);
                let mut ctx = loader_fabric
                    .context(Endpoint {
                        node,
                        port: Port(0),
                    })
                    .unwrap();
                ctx.add_link(s.memory().link(node).unwrap()).unwrap();
                ctx
            })
            .collect();
        let mut loader = Loader::new(&store);
        let mut keys = Vec::new();
        for (table, key, value) in workload.loader() {
            loader
                .load(table, key, &value, |node, offset, bytes| {
                    let mut list = PostList::new();
                    list.write(regions[usize::from(node.0)].at(offset).unwrap(), bytes);
                    local[usize::from(node.0)].post_now(list).unwrap();
                })
                .unwrap();
            keys.push((table, key));
        }
        Self {
            workload,
            servers: Rc::new(servers),
            store_config,
            regions,
            addrs,
            store,
            keys,
        }
    }

    /// A coordinator on a new context of `fabric` (port `port`) connected to every MN.
    fn coordinator<H: dmem_txn::HistorySink>(
        &self,
        fabric: &TcpFabric,
        port: u16,
        cfg: ProtocolConfig,
        id: u16,
        shared: CnShared,
        history: H,
    ) -> FordCoordinator<Clocked<dmem_tcp::TcpContext>, H> {
        let mut ctx = fabric.context(Port(port)).unwrap();
        for &a in &self.addrs {
            ctx.connect(a).unwrap();
        }
        FordCoordinator::new(
            Clocked::new(ctx),
            Rc::clone(&self.store),
            cfg,
            id,
            shared,
            history,
        )
        .unwrap()
    }

    /// Every loaded record, read by read-only transactions of `co` (16 per round).
    async fn read_all<C: Coordinator>(
        &self,
        co: &mut C,
    ) -> HashMap<(TableId, Key), Option<Vec<u8>>> {
        let mut finals = HashMap::new();
        for chunk in self.keys.chunks(16) {
            let reqs: Vec<ReadReq> = chunk.iter().map(|&(t, k)| ReadReq::read(t, k)).collect();
            let mut tx = co.begin(TxnKind::ReadOnly).await.unwrap();
            let values = tx.read_round(&reqs).await.unwrap();
            tx.commit().await.unwrap();
            finals.extend(chunk.iter().copied().zip(values));
        }
        finals
    }
}

/// Runs SmallBank on `cfg` over tcp and returns (checker verdict, invariant violations,
/// committed transactions).
fn smallbank_on_tcp(cfg: ProtocolConfig) -> (String, Vec<String>, u64) {
    let bank = TcpSmallBank::new();
    // Coordinators: one tcp context each (its own connection to every MN), all on one
    // real-time executor.
    let history = Rc::new(RefCell::new(History::new()));
    let fabric = TcpFabric::new(NodeId(MNS));
    let executor = Executor::new();
    let shared = CnShared::new();
    let delta = Rc::new(Cell::new(0i64));
    let committed = Rc::new(Cell::new(0u64));
    let workload = Rc::new(bank.workload.clone());
    for id in 0..COORDINATORS - 1 {
        let mut co = bank.coordinator(
            &fabric,
            id + 1,
            cfg,
            id,
            shared.clone(),
            Rc::clone(&history),
        );
        let (workload, delta, committed) = (
            Rc::clone(&workload),
            Rc::clone(&delta),
            Rc::clone(&committed),
        );
        executor.spawn(async move {
            let mut generator = workload.generator(u32::from(id), 7 ^ u64::from(id));
            for _ in 0..TXNS_PER_COORDINATOR {
                let txn = generator.next_txn();
                match execute(&*workload, &mut co, &txn, MAX_ATTEMPTS).await {
                    Executed::Committed { outcome, .. } => {
                        committed.set(committed.get() + 1);
                        if let Outcome::Commit { delta: d } = outcome {
                            delta.set(delta.get() + d);
                        }
                    }
                    Executed::RolledBack { .. } => {}
                    // Still aborting after every retry: in real time on a loaded host a
                    // lock holder waiting for its network reply can outlast 64 immediate
                    // retries. Giving up is an outcome, not a fault; the checker and the
                    // invariants still judge the run.
                    Executed::Failed { error, .. } if error.is_retryable() => {}
                    Executed::Failed { error, .. } => panic!("a transaction failed: {error}"),
                }
            }
        });
    }
    executor.run();

    // The final state, read by a last coordinator's read-only transactions.
    let mut last = bank.coordinator(
        &fabric,
        COORDINATORS,
        cfg,
        COORDINATORS - 1,
        shared,
        dmem_txn::NoHistory,
    );
    let finals = executor.block_on(bank.read_all(&mut last));
    let violations = workload
        .check(|t, k| finals.get(&(t, k)).cloned().flatten(), delta.get())
        .iter()
        .map(ToString::to_string)
        .collect();
    let verdict = verdict(&history.borrow());
    (verdict, violations, committed.get())
}

#[test]
fn ford_runs_smallbank_on_tcp_with_a_clean_checker() {
    let (verdict, violations, committed) = smallbank_on_tcp(ProtocolConfig::ford_fixed());
    assert_eq!(verdict, "ok");
    assert!(violations.is_empty(), "{violations:?}");
    assert!(committed > 600, "{committed} of 750 committed");
    eprintln!("{committed} committed");
}

#[test]
fn pandora_runs_smallbank_on_tcp_with_a_clean_checker() {
    let (verdict, violations, committed) = smallbank_on_tcp(ProtocolConfig::pandora());
    assert_eq!(verdict, "ok");
    assert!(violations.is_empty(), "{violations:?}");
    assert!(committed > 600, "{committed} of 750 committed");
    eprintln!("{committed} committed");
}

/// The MNs of a run, Pandora's link terminator on them: revocation at the tcp memory server
/// (its connections shut down, its hellos refused, nothing of the CN lands afterwards).
struct TcpTerminator(Rc<Vec<TcpMemoryServer>>);

impl dmem_ford::LinkTerminator for TcpTerminator {
    async fn terminate(&self, mn: NodeId, cn: NodeId) -> Result<(), dmem_verbs::VerbsError> {
        self.0[usize::from(mn.0)]
            .revoke(cn)
            .map(drop)
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
    let cfg = ProtocolConfig::pandora();
    let bank = TcpSmallBank::new();
    let (servers, addrs) = (Rc::clone(&bank.servers), bank.addrs.clone());
    // The surviving CN: coordinators 0..3, the detector, its stray-lock listener.
    let (survivor, victim) = (NodeId(MNS), NodeId(MNS + 1));
    let survivor_ids: Vec<u16> = (0..3).collect();
    let victim_ids: Vec<u16> = (3..COORDINATORS - 1).collect();
    let fabric = TcpFabric::new(survivor);
    let listener = fabric.listen("127.0.0.1:0".parse().unwrap()).unwrap();
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
        let (store_config, regions, addrs, victim_ids) = (
            bank.store_config.clone(),
            bank.regions.clone(),
            addrs.clone(),
            victim_ids.clone(),
        );
        let survivor_addr = listener.local_addr();
        std::thread::spawn(move || {
            let workload = Rc::new(AnyWorkload::new("smallbank", Scale::Tiny).unwrap());
            let store = Rc::new(Store::new(store_config, regions).unwrap());
            let fabric = TcpFabric::new(victim);
            let _listener = fabric.listen("127.0.0.1:0".parse().unwrap()).unwrap();
            fabric.add_peer(survivor, survivor_addr);
            let history = Rc::new(RefCell::new(History::new()));
            let shared = CnShared::new();
            let executor = Executor::new();
            let hb = Rc::new(Clocked::new(fabric.context(Port(98)).unwrap()));
            executor.spawn(async move {
                let _ = heartbeat_loop(&*hb, detector, HEARTBEAT, u64::MAX).await;
            });
            let committed = Rc::new(Cell::new(0u64));
            for &id in &victim_ids {
                let mut ctx = fabric.context(Port(id + 1)).unwrap();
                for &a in &addrs {
                    ctx.connect(a).unwrap();
                }
                let mut co = FordCoordinator::new(
                    Clocked::new(ctx),
                    Rc::clone(&store),
                    cfg,
                    id,
                    shared.clone(),
                    Rc::clone(&history),
                )
                .unwrap();
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
            let history = Rc::try_unwrap(history)
                .expect("every coordinator was dropped with the executor")
                .into_inner();
            (history, committed.get())
        })
    };

    let history = Rc::new(RefCell::new(History::new()));
    let shared = CnShared::new();
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
    let mut detector_ctx = fabric.context(detector.port).unwrap();
    for &a in &addrs {
        detector_ctx.connect(a).unwrap();
    }
    let mut manager = RecoveryManager::new(
        Clocked::new(detector_ctx),
        Rc::clone(&bank.store),
        cfg.protocol,
        TcpTerminator(Rc::clone(&servers)),
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
    let hb = Rc::new(Clocked::new(fabric.context(Port(98)).unwrap()));
    executor.spawn(async move {
        let _ = heartbeat_loop(&*hb, detector, HEARTBEAT, until).await;
    });
    let listen_ctx = Rc::new(Clocked::new(fabric.context(notify(survivor).port).unwrap()));
    let failed = Rc::clone(&shared.failed);
    executor.spawn(async move {
        let _ = membership_listener(&*listen_ctx, failed, HEARTBEAT, until).await;
    });
    let workload = Rc::new(bank.workload.clone());
    let after_crash = Rc::new(Cell::new(0u64));
    for &id in &survivor_ids {
        let mut co = bank.coordinator(
            &fabric,
            id + 1,
            cfg,
            id,
            shared.clone(),
            Rc::clone(&history),
        );
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
    for s in servers.iter() {
        let mut again = TcpFabric::new(victim).context(Port(1)).unwrap();
        assert!(again.connect(s.local_addr()).is_err());
    }
    // Both CNs' histories together are strictly serializable.
    let mut all = history.borrow().clone();
    all.txns.extend(victim_history.txns);
    assert_eq!(verdict(&all), "ok");
    // Every record is still readable, past the locks the victim left (PILL).
    let final_shared = CnShared::new();
    *final_shared.failed.borrow_mut() = shared.failed.borrow().clone();
    let mut last = bank.coordinator(
        &fabric,
        50,
        cfg,
        COORDINATORS - 1,
        final_shared,
        dmem_txn::NoHistory,
    );
    let finals = executor.block_on(bank.read_all(&mut last));
    let read = finals.values().flatten().count();
    assert_eq!(read, bank.keys.len());
}

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

/// Runs SmallBank on `cfg` over tcp and returns (checker verdict, invariant violations,
/// committed transactions).
fn smallbank_on_tcp(cfg: ProtocolConfig) -> (String, Vec<String>, u64) {
    let workload = AnyWorkload::new("smallbank", Scale::Tiny).unwrap();
    let spec = deploy_spec(&workload, COORDINATORS);
    let store_config = StoreConfig::for_tables(
        MNS,
        &spec.tables,
        spec.coordinators,
        spec.log_region_bytes,
        spec.index_slack * 2,
    );
    let bytes = store_config.bytes_per_mn().unwrap();
    let servers: Vec<TcpMemoryServer> = (0..MNS)
        .map(|i| {
            let mn = ShmMemoryNode::create(NodeId(i), RKey(0x5eed + u32::from(i)), bytes).unwrap();
            TcpMemoryServer::serve(mn, "127.0.0.1:0".parse().unwrap()).unwrap()
        })
        .collect();
    let regions = servers.iter().map(TcpMemoryServer::region).collect();
    let store = Rc::new(Store::new(store_config, regions).unwrap());

    // Load out of band, through a local shared-memory link to each MN's memory.
    let loader_fabric = ShmFabric::new();
    let local: Vec<ShmContext> = servers
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut ctx = loader_fabric
                .context(Endpoint {
                    node: NodeId(100 + i as u16),
                    port: Port(0),
                })
                .unwrap();
            ctx.add_link(s.memory().link(NodeId(100 + i as u16)).unwrap())
                .unwrap();
            ctx
        })
        .collect();
    let mut loader = Loader::new(&store);
    let mut keys: Vec<(TableId, Key)> = Vec::new();
    for (table, key, value) in workload.loader() {
        loader
            .load(table, key, &value, |node, offset, bytes| {
                let mut list = PostList::new();
                list.write(servers[usize::from(node.0)].region().at(offset).unwrap(), bytes);
                local[usize::from(node.0)].post_now(list).unwrap();
            })
            .unwrap();
        keys.push((table, key));
    }

    // Coordinators: one tcp context each (its own connection to every MN), all on one
    // real-time executor.
    let history = Rc::new(RefCell::new(History::new()));
    let fabric = TcpFabric::new(NodeId(MNS));
    let executor = Executor::new();
    let shared = CnShared::new();
    let delta = Rc::new(Cell::new(0i64));
    let committed = Rc::new(Cell::new(0u64));
    let workload = Rc::new(workload);
    let coordinator = |id: u16| {
        let mut ctx = fabric.context(Port(id + 1)).unwrap();
        for s in &servers {
            ctx.connect(s.local_addr()).unwrap();
        }
        FordCoordinator::new(
            Clocked::new(ctx),
            Rc::clone(&store),
            cfg,
            id,
            shared.clone(),
            Rc::clone(&history),
        )
        .unwrap()
    };
    for id in 0..COORDINATORS - 1 {
        let mut co = coordinator(id);
        let (workload, delta, committed) =
            (Rc::clone(&workload), Rc::clone(&delta), Rc::clone(&committed));
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
                    Executed::Failed { error, .. } => panic!("a transaction failed: {error}"),
                }
            }
        });
    }
    executor.run();

    // The final state, read by a last coordinator's read-only transactions.
    let mut last = coordinator(COORDINATORS - 1);
    let finals: HashMap<(TableId, Key), Option<Vec<u8>>> = executor.block_on(async {
        let mut finals = HashMap::new();
        for chunk in keys.chunks(16) {
            let reqs: Vec<ReadReq> = chunk.iter().map(|&(t, k)| ReadReq::read(t, k)).collect();
            let mut tx = last.begin(TxnKind::ReadOnly).await.unwrap();
            let values = tx.read_round(&reqs).await.unwrap();
            tx.commit().await.unwrap();
            finals.extend(chunk.iter().copied().zip(values));
        }
        finals
    });
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

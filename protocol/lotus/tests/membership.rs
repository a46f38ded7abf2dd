//! Recovery's control messages (LOTUS §6, `dmem_lotus::membership`) on the simulator: a
//! failure notice makes each survivor fence the failed CN and release its locks, a rejoin
//! broadcast unfences it, both are charged as messages (virtual time passes, the NICs count
//! them) and both get through when the network loses messages.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use dmem_locks::LockMode;
use dmem_locks::lotus::Holder;
use dmem_lotus::membership::notify;
use dmem_lotus::wire::RequestKind;
use dmem_lotus::{CnLocks, LockCluster, ShardMap, Sharding, serve};
use dmem_sim::{ClusterConfig, MessageFaults, Sim};
use dmem_verbs::{Clock, Verbs};

fn cluster(loss: f64) -> (Rc<Sim>, Rc<LockCluster>) {
    let sim = Rc::new(
        Sim::new(
            ClusterConfig::new("cx5")
                .unwrap()
                .mns(1)
                .cns(4)
                .threads_per_cn(1)
                .mn_memory_bytes(1 << 16)
                .message_faults(MessageFaults {
                    loss,
                    ..MessageFaults::default()
                })
                .seed(7),
        )
        .unwrap(),
    );
    let locks: Vec<Arc<CnLocks>> = (0..4).map(|c| Arc::new(CnLocks::new(c, 1 << 16))).collect();
    let mut servers = Vec::new();
    let mut contexts = Vec::new();
    for c in 0..4 {
        let ctx = sim.context(sim.cn(c), 0).unwrap();
        servers.push(vec![ctx.local_endpoint()]);
        contexts.push(ctx);
    }
    let cluster = Rc::new(LockCluster::new(
        locks,
        servers,
        Rc::new(RefCell::new(ShardMap::new(4))),
        Sharding::new(Vec::new()),
        60,
    ));
    for (c, ctx) in contexts.into_iter().enumerate() {
        let task = serve(
            ctx.clone(),
            Rc::clone(&cluster),
            Arc::clone(&cluster.cns[c]),
        );
        sim.spawn(&ctx, task);
    }
    (sim, cluster)
}

/// CN 3's transactions hold `per_cn` locks on each of CNs 1 and 2; CN 3 fails, CN 0
/// (recovery) notifies CNs 1 and 2; later CN 3 rejoins. Returns the virtual ns each
/// notice took, the messages sent, and the locks released.
fn fail_and_rejoin(loss: f64, per_cn: u64) -> (u64, u64, u64, u64) {
    let (sim, cluster) = cluster(loss);
    for c in [1usize, 2] {
        for k in 0..per_cn {
            let holder = Holder {
                txn: 100 + k,
                cn: 3,
            };
            let got = cluster.cns[c].acquire(1000 * c as u64 + k, 0, LockMode::Exclusive, holder);
            assert!(got.is_held());
        }
        // A lock of a survivor's transaction stays.
        let got = cluster.cns[c].acquire(1, 0, LockMode::Shared, Holder { txn: 1, cn: 0 });
        assert!(got.is_held());
    }
    cluster.failed.borrow_mut().push(3);
    let out = Rc::new(RefCell::new(None));
    let ctx = sim.context(sim.cn(0), 0).unwrap();
    let (c2, cl, o) = (ctx.clone(), Rc::clone(&cluster), Rc::clone(&out));
    sim.spawn(&ctx, async move {
        let t0 = c2.now();
        let sent = notify(&c2, &cl, RequestKind::Release, 3, &[1, 2], 20_000)
            .await
            .unwrap();
        let release_ns = c2.now() - t0;
        for c in [1usize, 2] {
            assert!(cl.cns[c].table.is_fenced(3), "CN {c} fences the failed CN");
            assert_eq!(
                cl.cns[c].table.held(),
                1,
                "only the survivor's lock is left"
            );
        }
        let released = cl.released.borrow()[3];
        cl.failed.borrow_mut().retain(|&x| x != 3);
        let t1 = c2.now();
        let sent2 = notify(&c2, &cl, RequestKind::Rejoin, 3, &[1, 2], 20_000)
            .await
            .unwrap();
        let rejoin_ns = c2.now() - t1;
        for c in [1usize, 2] {
            assert!(!cl.cns[c].table.is_fenced(3), "CN {c} serves the CN again");
        }
        *o.borrow_mut() = Some((release_ns + rejoin_ns, sent + sent2, released, rejoin_ns));
    });
    sim.run_until(10_000_000);
    out.borrow_mut().take().expect("both notices were answered")
}

#[test]
fn notices_release_fence_and_unfence_as_messages() {
    let (ns, sent, released, rejoin_ns) = fail_and_rejoin(0.0, 5);
    assert_eq!(released, 10, "5 locks on each of two survivors");
    assert_eq!(sent, 4, "one message per survivor per notice");
    // A message each way: more than the NIC's base latency, well under the timeout.
    assert!(rejoin_ns > 500 && rejoin_ns < 20_000, "{rejoin_ns} ns");
    assert!(ns > rejoin_ns);
}

#[test]
fn notices_get_through_a_lossy_network() {
    // Half the messages lost: resent every 20 µs until every survivor has answered.
    let (ns, sent, released, _) = fail_and_rejoin(0.5, 3);
    assert_eq!(released, 6);
    assert!(sent > 4, "some were resent: {sent}");
    assert!(ns >= 20_000, "waited for a timeout at least once: {ns} ns");
}

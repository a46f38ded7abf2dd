//! Dandelion and FaSST on the shared-memory fabric in real time: the servers' message loops,
//! coordinators and clients of `dmem_harness::servers::run_servers` on this thread's
//! executor, the servers' RPCs as shm two-sided messages. Fixed numbers of transactions,
//! no timing assertions: the checker, SmallBank's invariants and the packets' contents.

use dmem_harness::fabric::Fabric;
use dmem_harness::servers::{RunLength, ServersConfig, ServersResult, run_servers};
use dmem_workloads::{AnyWorkload, Scale};

/// Tiny SmallBank on `protocol` over shm: 3 servers × 2 threads × 4 coordinators, 40
/// transactions each, each tried up to `max_attempts` times.
fn smallbank_on_shm(protocol: &str, max_attempts: u32) -> ServersResult {
    let workload = AnyWorkload::new("smallbank", Scale::Tiny).unwrap();
    let protocol = dmem_protocols::registry().get(protocol).unwrap();
    let cfg = ServersConfig {
        fabric: Fabric::Shm,
        servers: 3,
        threads: 2,
        coroutines: 4,
        seed: 3,
        length: RunLength::Txns(40),
        check: true,
        max_attempts,
        backoff: dmem_harness::Backoff::None,
    };
    run_servers(&*protocol, &workload, &cfg).unwrap()
}

fn runs_clean(protocol: &str) -> ServersResult {
    let r = smallbank_on_shm(protocol, dmem_harness::MAX_ATTEMPTS);
    eprintln!("{protocol} on shm: {r:?}");
    assert_eq!(r.checker, "ok", "{protocol}");
    assert_eq!(r.invariants, "ok", "{protocol}");
    let all = 3 * 2 * 4 * 40;
    assert_eq!(
        r.committed + r.rolled_back + r.given_up.values().sum::<u64>(),
        all,
        "{protocol}: every transaction finished"
    );
    assert!(r.committed > all * 3 / 4, "{protocol}: {r:?}");
    assert!(r.checked_txns as u64 >= r.committed);
    // Nothing is lost in one process, but a loaded host can hold a response past the 100 ms
    // retransmission timeout: re-sent requests then replay their cached responses.
    assert!(r.counters.contains_key("retransmissions"), "{protocol}");
    r
}

#[test]
fn dnl_4_runs_smallbank_on_shm() {
    let r = runs_clean("dnl-4");
    // Every failed attempt has a reason; a given-up transaction's last try is one of them.
    let aborts: u64 = r.aborts.values().sum();
    assert!(aborts >= r.given_up.values().sum::<u64>(), "{r:?}");
    assert_eq!(r.abort_rate > 0.0, aborts > 0, "{r:?}");
}

/// One try per transaction: every abort gives its transaction up, so the aborts by reason
/// and the transactions given up by error count the same attempts.
#[test]
fn one_attempt_gives_up_every_aborted_transaction() {
    for protocol in ["dnl-4", "fasst"] {
        let r = smallbank_on_shm(protocol, 1);
        eprintln!("{protocol} on shm, 1 attempt: {r:?}");
        assert_eq!(r.checker, "ok", "{protocol}");
        assert_eq!(r.invariants, "ok", "{protocol}");
        let aborts: u64 = r.aborts.values().sum();
        let given_up: u64 = r.given_up.values().sum();
        assert_eq!(aborts, given_up, "{protocol}: {r:?}");
        assert!(
            given_up > 0,
            "{protocol}: nothing aborted, the test shows nothing: {r:?}"
        );
        assert_eq!(
            r.committed + r.rolled_back + given_up,
            3 * 2 * 4 * 40,
            "{protocol}"
        );
    }
}

#[test]
fn fasst_runs_smallbank_on_shm() {
    runs_clean("fasst");
}

#[test]
fn batching_puts_several_messages_in_a_packet_on_shm_and_the_switch_turns_it_off() {
    let batched = runs_clean("dnl-4");
    let per_packet = batched.msgs_per_packet.unwrap();
    assert!(
        per_packet > 1.0,
        "dnl-4 on shm: {per_packet} messages per packet"
    );
    let unbatched = runs_clean("dnl:4+no-net-batch");
    assert_eq!(unbatched.msgs_per_packet, Some(1.0));
}

#[test]
fn the_simulator_and_non_symmetric_protocols_are_refused() {
    let workload = AnyWorkload::new("smallbank", Scale::Tiny).unwrap();
    let protocol = dmem_protocols::registry().get("dnl-4").unwrap();
    let cfg = ServersConfig {
        fabric: Fabric::Sim,
        servers: 3,
        threads: 1,
        coroutines: 1,
        seed: 1,
        length: RunLength::Txns(1),
        check: false,
        max_attempts: 1,
        backoff: dmem_harness::Backoff::None,
    };
    assert!(run_servers(&*protocol, &workload, &cfg).is_err());
    // No tries at all is refused too.
    let none = ServersConfig {
        fabric: Fabric::Shm,
        max_attempts: 0,
        backoff: dmem_harness::Backoff::None,
        ..cfg.clone()
    };
    assert!(run_servers(&*protocol, &workload, &none).is_err());
    // A protocol that is not symmetric has no servers to deploy.
    let ford = dmem_protocols::registry().get("ford").unwrap();
    let err = run_servers(
        &*ford,
        &workload,
        &ServersConfig {
            fabric: Fabric::Shm,
            ..cfg
        },
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("not a symmetric protocol"),
        "{err}"
    );
}

#[test]
fn recovery_of_servers_on_shm_is_refused_with_a_typed_error() {
    use std::cell::RefCell;
    use std::rc::Rc;

    use dmem_deploy::{DeployError, Recorder};
    use dmem_harness::fabric::LocalCluster;
    use dmem_txn::History;

    let cluster = LocalCluster::with_threads(Fabric::Shm, 0, 2, 1, 0, 1).unwrap();
    let servers = (0..2)
        .map(|s| vec![cluster.context(s, 0).unwrap()])
        .collect();
    let protocol = dmem_protocols::registry().get("dnl-4").unwrap();
    let history = Recorder::new(Rc::new(RefCell::new(History::new())));
    let mut deployment = protocol
        .deploy_servers(servers, &|ctx, task| cluster.spawn(ctx, task), history)
        .unwrap();
    // Its recovery reads the simulator's crash state: a deployment on another fabric has
    // no simulated recovery to start.
    assert!(deployment.sim_recovery().is_none());
    let err = dmem_deploy::require_sim_recovery(&mut *deployment, "dnl-4")
        .err()
        .unwrap();
    assert!(matches!(err, DeployError::NoSimRecovery(_)), "{err}");
    // A ragged shape (servers with different thread counts) is refused too.
    let ragged = vec![
        vec![cluster.context(0, 1).unwrap()],
        vec![
            cluster.context(1, 1).unwrap(),
            cluster.context(1, 2).unwrap(),
        ],
    ];
    let history = Recorder::new(Rc::new(RefCell::new(History::new())));
    assert!(
        protocol
            .deploy_servers(ragged, &|ctx, task| cluster.spawn(ctx, task), history)
            .is_err()
    );
}

#[test]
fn a_deployment_of_one_server_loads_its_replicas_and_refuses_foreign_contexts() {
    use std::cell::RefCell;
    use std::rc::Rc;

    use dmem_deploy::Recorder;
    use dmem_harness::fabric::LocalCluster;
    use dmem_txn::{History, Key, TableId};
    use dmem_verbs::{Endpoint, Verbs as _};

    let recorder = || Recorder::new(Rc::new(RefCell::new(History::new())));
    let cluster = LocalCluster::with_threads(Fabric::Shm, 0, 3, 1, 0, 1).unwrap();
    let contexts: Vec<_> = (0..3).map(|s| cluster.context(s, 0).unwrap()).collect();
    let endpoints: Vec<Vec<Endpoint>> = contexts.iter().map(|c| vec![c.local_endpoint()]).collect();
    // Two replicas on three servers: each server loads about two thirds of the records,
    // together every record twice.
    let protocol = dmem_protocols::registry().get("dnl:4+r=2").unwrap();
    assert_eq!(protocol.servers_needed(), 2);
    let mut loaded = Vec::new();
    for (s, ctx) in contexts.iter().enumerate() {
        let mut d = protocol
            .deploy_server(s as u16, endpoints.clone(), vec![ctx.clone()], recorder())
            .unwrap();
        for key in 0..300 {
            d.load(TableId(0), Key(key), &key.to_le_bytes()).unwrap();
        }
        loaded.push(d.counter("records_loaded").unwrap());
    }
    assert_eq!(loaded.iter().sum::<u64>(), 600, "{loaded:?}");
    assert!(
        loaded.iter().all(|&n| (100..300).contains(&n)),
        "{loaded:?}"
    );
    // Server 0 on server 1's context, and a protocol that is not symmetric.
    let err = protocol
        .deploy_server(0, endpoints.clone(), vec![contexts[1].clone()], recorder())
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("not at server 0's endpoint"),
        "{err}"
    );
    let ford = dmem_protocols::registry().get("ford").unwrap();
    assert_eq!(ford.servers_needed(), 1);
    let err = ford
        .deploy_server(0, endpoints, vec![contexts[0].clone()], recorder())
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("not a symmetric protocol"),
        "{err}"
    );
}

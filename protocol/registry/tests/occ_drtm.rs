//! DrTM (lease-based shared locks, OOCC §II-A) on the same bank: strictly serializable.

mod occ_common;

use std::rc::Rc;

use dmem_deploy::{AnyContext, DeploySpec, MnMemory, Protocol, Recorder, TableDemand};
use dmem_occ::drift::{Drift, DriftModel};
use dmem_occ::drtm::DrtmConfig;
use dmem_protocols::OoccProtocol;
use dmem_runtime::{Executor, RealClock};
use dmem_shm::{ShmFabric, ShmMemoryNode};
use dmem_txn::{Coordinator, Key, ReadReq, Transaction, TxnKind};
use dmem_verbs::{Clock, Endpoint, NodeId, Port, RKey};
use occ_common::*;

#[test]
fn drtm_bank_is_strictly_serializable() {
    for seed in 1..=2 {
        let p = OoccProtocol::drtm("drtm", DrtmConfig::default());
        let (history, audits, commits) = bank(&p, seed);
        assert!(
            audits > 50 && commits > 20,
            "{audits} audits, {commits} transfers"
        );
        verdict(&history.borrow()).unwrap();
        assert!(attributed_reads(&history.borrow()) > 20);
    }
}

/// DSLR two-phase locking on the same bank: strictly serializable.
#[test]
fn dslr_bank_is_strictly_serializable() {
    for seed in 1..=2 {
        let p = OoccProtocol::dslr("dslr", dmem_occ::dslr2pl::DslrConfig::default());
        let (history, audits, commits) = bank(&p, seed);
        assert!(
            audits > 50 && commits > 20,
            "{audits} audits, {commits} transfers"
        );
        verdict(&history.borrow()).unwrap();
        assert!(attributed_reads(&history.borrow()) > 20);
    }
}

/// On a real fabric every CN reads the host's `CLOCK_MONOTONIC`, so a DrTM read lease (an
/// absolute lease end, written by the reader's clock and compared by the writer's) holds a
/// writer of another CN off until it ends. The simulator's drift model must not be laid
/// over real clocks: it drifts `true × ppm` from true time 0, and a real context's true
/// time counts from boot, so the default ±100 ppm put the two CNs of a `dmem cluster` run
/// seconds apart after hours of uptime (a writer ahead took a record whose read lease was
/// still running, and the checker found a G-single cycle). Here the writer's node is given
/// a 50 ms offset on top of the default model, so that the test does not depend on the
/// host's uptime; a 20 ms lease.
#[test]
fn drtm_read_lease_holds_a_writer_of_another_cn_off_on_real_clocks() {
    let cfg = DrtmConfig {
        lease_ns: 20_000_000,
        ..DrtmConfig::default()
    };
    let (writer_node, reader_node) = (NodeId(1), NodeId(2));
    let p = OoccProtocol::drtm("drtm", cfg).with_drift(DriftModel::default().with(
        writer_node,
        Drift {
            offset_ns: 50_000_000,
            ppm: 0,
        },
    ));
    let spec = DeploySpec::new(
        vec![TableDemand {
            id: T,
            value_len: 8,
            expected_records: 1,
            grows: false,
        }],
        64,
    );
    let mn =
        ShmMemoryNode::create(NodeId(0), RKey(1), p.mn_bytes_per_mn(&spec, 1).unwrap()).unwrap();
    let memory = MnMemory::mapped(vec![mn.region()], &[&mn]).unwrap();
    let mut d = p
        .deploy_on(memory, &spec, Recorder::new(Rc::default()))
        .unwrap();
    d.load(T, Key(0), &7u64.to_le_bytes()).unwrap();
    let fabric = ShmFabric::new();
    let context = |node: NodeId| {
        let mut c = fabric
            .context(Endpoint {
                node,
                port: Port(0),
            })
            .unwrap();
        c.add_link(mn.link(node).unwrap()).unwrap();
        AnyContext::Shm(Rc::new(c))
    };
    let mut writer = d.coordinator(context(writer_node), 0).unwrap();
    let mut reader = d.coordinator(context(reader_node), 1).unwrap();
    Executor::new().block_on(async {
        let mut r = reader.begin(TxnKind::ReadOnly).await.unwrap();
        let before = RealClock.now();
        r.read_round(&[ReadReq::read(T, Key(0))]).await.unwrap();
        let mut w = writer.begin(TxnKind::ReadWrite).await.unwrap();
        w.read_round(&[ReadReq::for_update(T, Key(0))])
            .await
            .expect("the writer waits the read lease out and locks");
        let waited = RealClock.now() - before;
        assert!(
            waited >= cfg.lease_ns,
            "the writer locked the record {waited} ns after the reader's {} ns lease began",
            cfg.lease_ns
        );
        w.abort().await;
        r.abort().await;
    });
}

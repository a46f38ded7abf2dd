//! A CN killed at the instant it resolves a committed transaction in its history (issue
//! #17): every protocol that recovers from logs must still find that transaction's log, so
//! that recovery's decision settles it as committed. A protocol that clears its log (a redo
//! log truncated, an op log marked idle) before resolving leaves an `Unknown` transaction
//! and no log; the settlement calls it aborted although its records landed, and the next
//! read of them is a version no transaction of the history installed.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use dmem_deploy::process::{CnContexts, DurableSlots, ProcessPlan};
use dmem_deploy::{
    AnyContext, ClusterShape, Decision, DeploySpec, Deployment, MnMemory, Protocol, Recorder,
    RecoveryEvent, RecoveryTiming, TableDemand, settle_history,
};
use dmem_sim::{NicProfile, Sim};
use dmem_txn::{
    Coordinator, CoordinatorId, History, HistorySink, Key, ReadReq, TableId, Transaction, TxnId,
    TxnKind, TxnOutcome, TxnRecord, check,
};
use dmem_verbs::{Clock, Nanos, NodeId};

/// A CN process's history stream (`dmem cn` writes every record and resolution to stdout
/// as it happens) whose process is killed at the instant `victim` resolves its first
/// committed read-write transaction: that resolution never gets out, nothing the victim's
/// CN records afterwards does either, and the CN crashes at its next work request (nothing
/// it posts from then on lands). The transaction stays `Unknown` until recovery's decision
/// settles it, as in the merged history of a real cluster.
struct KilledAtResolve {
    history: Rc<RefCell<History>>,
    sim: Rc<Sim>,
    cn: NodeId,
    victim: CoordinatorId,
    killed: Cell<Option<TxnId>>,
    /// Runs at the kill: keeps what the process leaves behind (Motor's durable op logs).
    at_kill: RefCell<Option<Box<dyn FnOnce()>>>,
}

impl HistorySink for KilledAtResolve {
    fn record(&self, txn: TxnRecord) {
        if self.killed.get().is_none() || txn.id.coordinator != self.victim {
            self.history.record(txn);
        }
    }

    fn resolve(&self, id: TxnId, outcome: TxnOutcome, end: Nanos) {
        if id.coordinator != self.victim {
            self.history.resolve(id, outcome, end);
        } else if self.killed.get().is_none() && outcome == TxnOutcome::Committed {
            self.killed.set(Some(id));
            if let Some(keep) = self.at_kill.borrow_mut().take() {
                keep();
            }
            let posted = self.sim.stats().nodes[usize::from(self.cn.0)]
                .nic
                .wrs_posted;
            self.sim.crash_at_work_request(self.cn, posted);
        } else if self.killed.get().is_none() {
            self.history.resolve(id, outcome, end);
        }
    }
}

/// Two accounts; coordinator 1 on CN 1 transfers between them and is killed as it resolves
/// its first commit (see [`KilledAtResolve`], which runs `at_kill` then); coordinator 0 on
/// CN 0 reads both accounts every 20 µs from 100 µs on. `prepare` sees the deployment
/// before its coordinators are made. Returns the deployment, the simulator (nothing run
/// yet) and the sink.
fn transfers(
    protocol: &dyn Protocol,
    at_kill: Option<Box<dyn FnOnce()>>,
    prepare: impl FnOnce(&mut dyn Deployment, &Rc<Sim>),
) -> (Box<dyn Deployment>, Rc<Sim>, Rc<KilledAtResolve>) {
    const T: TableId = TableId(1);
    let shape = ClusterShape {
        mns: 2,
        cns: 2,
        threads: 1,
        seed: 1,
        profile: NicProfile::named("cx6").unwrap(),
        min_mn_bytes: 1 << 20,
        message_faults: dmem_sim::MessageFaults::default(),
    };
    let spec = DeploySpec::new(
        vec![TableDemand {
            id: T,
            value_len: 8,
            expected_records: 2,
            grows: false,
        }],
        64,
    );
    let sim = shape
        .build(protocol.mn_bytes_per_mn(&spec, shape.mns).unwrap())
        .unwrap();
    let sink = Rc::new(KilledAtResolve {
        history: Rc::default(),
        sim: Rc::clone(&sim),
        cn: sim.cn(1),
        victim: CoordinatorId(1),
        killed: Cell::new(None),
        at_kill: RefCell::new(at_kill),
    });
    let mut d = protocol
        .deploy_on(
            MnMemory::sim(&sim),
            &spec,
            Recorder::streaming(Rc::clone(&sink) as Rc<dyn HistorySink>),
        )
        .unwrap();
    for k in 0..2 {
        d.load(T, Key(k), &100u64.to_le_bytes()).unwrap();
    }
    prepare(&mut *d, &sim);
    let balance =
        |v: &Option<Vec<u8>>| u64::from_le_bytes(v.as_ref().unwrap()[..8].try_into().unwrap());
    let reader_ctx = sim.context(sim.cn(0), 0).unwrap();
    let mut reader = d.coordinator(reader_ctx.clone().into(), 0).unwrap();
    let clock = reader_ctx.clone();
    sim.spawn(&reader_ctx, async move {
        let reader_ctx = clock;
        reader_ctx.sleep(100_000).await;
        while reader_ctx.now() < 600_000 {
            if let Ok(mut t) = reader.begin(TxnKind::ReadOnly).await
                && let Ok(v) = t
                    .read_round(&[ReadReq::read(T, Key(0)), ReadReq::read(T, Key(1))])
                    .await
            {
                assert_eq!(balance(&v[0]) + balance(&v[1]), 200);
                let _ = t.commit().await;
            }
            reader_ctx.sleep(20_000).await;
        }
    });
    let victim_ctx = sim.context(sim.cn(1), 0).unwrap();
    let mut victim = d.coordinator(victim_ctx.clone().into(), 1).unwrap();
    let clock = victim_ctx.clone();
    sim.spawn(&victim_ctx, async move {
        let victim_ctx = clock;
        while victim_ctx.now() < 600_000 {
            if let Ok(mut t) = victim.begin(TxnKind::ReadWrite).await
                && let Ok(v) = t
                    .read_round(&[
                        ReadReq::for_update(T, Key(0)),
                        ReadReq::for_update(T, Key(1)),
                    ])
                    .await
                && t.write(T, Key(0), &(balance(&v[0]) - 1).to_le_bytes())
                    .await
                    .is_ok()
                && t.write(T, Key(1), &(balance(&v[1]) + 1).to_le_bytes())
                    .await
                    .is_ok()
            {
                let _ = t.commit().await;
            }
            victim_ctx.sleep(5_000).await;
        }
    });
    (d, sim, sink)
}

/// [`transfers`] with the simulator's recovery of the killed CN. Returns the merged history
/// settled by recovery's decisions (as `dmem cluster` settles it), the killed transaction
/// and the recovery events.
fn killed_at_resolve(protocol: &dyn Protocol) -> (History, TxnId, Vec<RecoveryEvent>) {
    let (mut d, sim, sink) = transfers(protocol, None, |_, _| {});
    let timing = RecoveryTiming {
        heartbeat: 10_000,
        timeout: 50_000,
        poll: 5_000,
        until: 1_000_000,
    };
    d.sim_recovery()
        .unwrap()
        .start_recovery(&sim, 0, timing)
        .unwrap();
    sim.run_until_idle();
    assert_eq!(d.sim_recovery().unwrap().recovery_error(), None);
    let killed = sink.killed.get().expect("the victim committed a transfer");
    let events = d.sim_recovery().unwrap().recovery_events();
    // Recovery's decisions settle the merged history, as `dmem cluster` does.
    for e in &events {
        for c in &e.coordinators {
            settle_history(&sink.history, c, e.finished_at);
        }
    }
    let history = sink.history.borrow().clone();
    (history, killed, events)
}

/// Issue #17 (a phantom version under DrTM's killed-CN recovery across processes): each
/// protocol that recovers a killed CN from logs resolves a committed transaction before it
/// clears its log, so the log of a CN killed at that instant is still there: recovery rolls
/// it forward (onto no record: every one already shows the new version) and settles the
/// transaction as committed. With the old order (log cleared first), each of them failed
/// here with the phantom version.
///
/// Motor (the same order fixed: resolved before its op log is marked idle) cannot be
/// killed this way here: its op log is CN memory, written by the coordinator whether or not
/// the simulator has crashed the CN, so the entry is cleared after the modelled kill anyway;
/// [`motor_killed_as_it_resolves_a_commit_leaves_its_op_log_committing`] checks what a
/// killed CN process leaves instead.
#[test]
fn a_cn_killed_as_it_resolves_a_commit_leaves_its_log_to_recovery() {
    let registry = dmem_protocols::registry();
    for name in ["drtm", "oocc", "dslr"] {
        let p = registry.get(name).unwrap();
        let (history, killed, events) = killed_at_resolve(&*p);
        let verdict = check(&history);
        assert!(verdict.is_ok(), "{name}: {:?}", verdict.anomalies.first());
        assert_eq!(events.len(), 1, "{name}: one CN failure recovered");
        let c = &events[0].coordinators;
        assert_eq!(c.len(), 1, "{name}");
        assert_eq!(
            (c[0].txn, c[0].decision),
            (Some(killed.seq), Some(Decision::RollForward)),
            "{name}: the killed transaction's log was still there"
        );
        let t = history
            .txns
            .iter()
            .find(|t| t.id == killed)
            .expect("the killed transaction was recorded");
        assert_eq!(t.outcome, TxnOutcome::Committed, "{name}");
        // The checker could fail: a later transaction read what the killed one installed.
        let read_after = history.txns.iter().any(|r| {
            r.id.coordinator != killed.coordinator
                && r.outcome == TxnOutcome::Committed
                && r.reads.iter().any(|e| {
                    t.writes
                        .iter()
                        .any(|w| w.key == e.key && w.version == e.version)
                })
        });
        assert!(
            read_after,
            "{name}: nobody read the killed transaction's writes"
        );
    }
}

/// Motor's op log of a CN process killed as it resolves a commit (issue #17). Across
/// processes a CN writes its coordinators' op logs through to durable slots
/// (`ProcessDeployment::process_tasks`: files that outlive the process, as Motor's UPS-backed DRAM
/// outlives a crash), and the detector's recovery decides the killed CN's transactions from
/// what those slots held when it died. Here the victim CN's deployment mirrors its op logs
/// as a CN process does, and the slots are copied at the instant its first commit is
/// resolved — what a process killed there leaves behind. They must still hold that
/// transaction committing, so that recovery rolls it forward and settles it as committed;
/// with the op log marked idle before the resolution (the order before the fix), they hold
/// `Idle`, recovery decides nothing, and the settlement calls aborted a transaction whose
/// versions had landed — the phantom version.
#[test]
fn motor_killed_as_it_resolves_a_commit_leaves_its_op_log_committing() {
    use dmem_motor::OpLog;

    let dir = std::env::temp_dir().join(format!("dmem-motor-killed-{}", std::process::id()));
    let (state, kept) = (dir.join("state"), dir.join("kept"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&kept).unwrap();
    // The process dies here: its durable slots, as they are at this instant.
    let keep = {
        let (state, kept) = (state.clone(), kept.clone());
        Box::new(move || {
            for f in std::fs::read_dir(&state).unwrap() {
                let f = f.unwrap();
                std::fs::copy(f.path(), kept.join(f.file_name())).unwrap();
            }
        }) as Box<dyn FnOnce()>
    };
    let protocol = dmem_protocols::registry().get("motor").unwrap();
    let plan_state = state.clone();
    let (_d, sim, sink) = transfers(&*protocol, Some(keep), move |d, sim| {
        // CN 1 (coordinator 1) as a CN process: its op logs written through to the slots.
        let plan = ProcessPlan::on_ports(
            [(sim.cn(0), vec![0]), (sim.cn(1), vec![1])],
            0,
            10_000,
            50_000,
            50_000,
            plan_state,
        );
        let ctx = || AnyContext::Sim(sim.context(sim.cn(1), 0).unwrap());
        let ctxs = CnContexts {
            heartbeat: ctx(),
            listener: ctx(),
            services: Vec::new(),
        };
        // Its heartbeat task is not run: nobody detects here.
        drop(
            d.processes()
                .unwrap()
                .process_tasks(sim.cn(1), ctxs, &plan)
                .unwrap(),
        );
    });
    sim.run_until_idle();
    let killed = sink.killed.get().expect("the victim committed a transfer");
    let read = |dir: &std::path::Path| {
        let bytes = DurableSlots::new(dir).unwrap().read(1).unwrap();
        OpLog::parse(&bytes.expect("coordinator 1's op log was written")).unwrap()
    };
    match read(&kept) {
        OpLog::Committing { seq, installs, .. } => {
            assert_eq!(seq, killed.seq, "the killed transaction's op log");
            assert_eq!(installs.len(), 2, "both accounts are installed");
        }
        other => panic!(
            "a CN killed as it resolved T{}.{} left op log {other:?}: recovery would call it aborted",
            killed.coordinator.0, killed.seq
        ),
    }
    // The slots the process left did change afterwards: the kill point matters.
    assert_ne!(
        read(&state),
        read(&kept),
        "the victim's op log never moved on after the kill point"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

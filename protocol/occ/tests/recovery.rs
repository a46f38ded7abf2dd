//! CN crashes under Pandora's litmus tests: OOCC's redo logs roll forward a transaction
//! whose commit WRITEs had partly landed (some record already visible), every other
//! in-flight transaction is rolled back, stray locks are released, and no litmus assertion
//! or history check fails.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use dmem_deploy::{
    AnyContext, ClusterShape, Decision, DeployError, DeploySpec, Deployment, MnMemory, Protocol,
    Recorder, RecoveryEvent, RecoveryTiming, TableDemand, settle_history,
};
use dmem_litmus::{Litmus, RunConfig, RunOutcome, run_one};
use dmem_occ::{OoccConfig, OoccProtocol};
use dmem_sim::{NicProfile, Sim};
use dmem_txn::{
    BoxCoordinator, Coordinator, CoordinatorId, History, HistorySink, Key, ReadReq, TableId,
    Transaction, TxnId, TxnKind, TxnOutcome, TxnRecord, check,
};
use dmem_verbs::{Clock, Nanos, NodeId};

thread_local! {
    static EVENTS: RefCell<Vec<RecoveryEvent>> = const { RefCell::new(Vec::new()) };
}

/// OOCC, with every deployment's recovery events kept for the test.
struct Recorded(OoccProtocol);

struct RecordedDeployment(Box<dyn Deployment>);

impl Drop for RecordedDeployment {
    fn drop(&mut self) {
        let events = self.0.recovery_events();
        EVENTS.with(|e| e.borrow_mut().extend(events));
    }
}

impl Protocol for Recorded {
    fn name(&self) -> String {
        self.0.name()
    }
    fn mn_bytes_per_mn(&self, spec: &DeploySpec, mns: u16) -> Result<u64, DeployError> {
        self.0.mn_bytes_per_mn(spec, mns)
    }
    fn deploy_on(
        &self,
        memory: MnMemory,
        spec: &DeploySpec,
        history: Recorder,
    ) -> Result<Box<dyn Deployment>, DeployError> {
        Ok(Box::new(RecordedDeployment(
            self.0.deploy_on(memory, spec, history)?,
        )))
    }
}

impl Deployment for RecordedDeployment {
    fn load(&mut self, table: TableId, key: Key, value: &[u8]) -> Result<(), DeployError> {
        self.0.load(table, key, value)
    }
    fn coordinator(&mut self, ctx: AnyContext, id: u16) -> Result<BoxCoordinator, DeployError> {
        self.0.coordinator(ctx, id)
    }
    fn start_recovery(
        &mut self,
        sim: &Rc<Sim>,
        recovery_cn: u16,
        timing: RecoveryTiming,
    ) -> Result<(), DeployError> {
        self.0.start_recovery(sim, recovery_cn, timing)
    }
    fn final_coordinator(
        &mut self,
        ctx: AnyContext,
        id: u16,
    ) -> Result<BoxCoordinator, DeployError> {
        self.0.final_coordinator(ctx, id)
    }
    fn recovery_events(&self) -> Vec<RecoveryEvent> {
        self.0.recovery_events()
    }
    fn recovery_error(&self) -> Option<String> {
        self.0.recovery_error()
    }
    fn paused(&self) -> Rc<Cell<bool>> {
        self.0.paused()
    }
    fn read_final(&self, table: TableId, key: Key) -> Option<Vec<u8>> {
        self.0.read_final(table, key)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Runs litmus 1, 2 and 3 (`DirectWrite`, `IndirectWrite`, `ReadWrite`) for seeds
/// `0..seeds` with a CN crash in every run, handing each outcome to `check`.
fn for_each_run(p: &dyn Protocol, seeds: u64, mut check: impl FnMut(Litmus, u64, RunOutcome)) {
    let cfg = RunConfig::new(1.0);
    for litmus in [
        Litmus::DirectWrite,
        Litmus::IndirectWrite,
        Litmus::ReadWrite,
    ] {
        for seed in 0..seeds {
            check(litmus, seed, run_one(p, litmus, seed, &cfg).unwrap());
        }
    }
}

#[test]
fn redo_logs_roll_partly_committed_transactions_forward() {
    let p = Recorded(OoccProtocol::new("oocc", OoccConfig::default()));
    let mut runs = 0;
    for_each_run(&p, 300, |litmus, seed, out| {
        assert!(
            out.violation.is_none(),
            "{litmus:?} seed {seed}: {:?}",
            out.violation
        );
        runs += 1;
    });
    let events = EVENTS.with(|e| e.borrow().clone());
    let coordinators = events.iter().flat_map(|e| e.coordinators.iter());
    let (mut forward, mut restored, mut back, mut unlocked) = (0, 0, 0, 0);
    for c in coordinators {
        match c.decision {
            Some(Decision::RollForward) => {
                forward += 1;
                restored += c.restored;
            }
            Some(Decision::RollBack) => back += 1,
            None => {}
        }
        unlocked += c.unlocked;
    }
    eprintln!(
        "{runs} runs, {} recoveries: {forward} rolled forward ({restored} records completed from redo logs), {back} rolled back, {unlocked} stray locks released",
        events.len()
    );
    assert!(
        forward > 0 && restored > 0,
        "no crash fell between two commit WRITEs"
    );
    assert!(back > 0 && unlocked > 0);
}

#[test]
fn dslr_rolls_whole_logs_forward_and_resets_dead_tickets() {
    let p = Recorded(OoccProtocol::dslr(
        "dslr",
        dmem_occ::dslr2pl::DslrConfig::default(),
    ));
    let mut runs = 0;
    for_each_run(&p, 300, |litmus, seed, out| {
        assert!(
            out.violation.is_none(),
            "{litmus:?} seed {seed}: {:?}",
            out.violation
        );
        assert_eq!(out.recoveries, 1, "{litmus:?} seed {seed}");
        runs += 1;
    });
    let events = EVENTS.with(|e| e.borrow().clone());
    let (mut forward, mut restored) = (0, 0);
    for c in events.iter().flat_map(|e| e.coordinators.iter()) {
        assert_ne!(
            c.decision,
            Some(Decision::RollBack),
            "DSLR logs only decided"
        );
        assert_eq!(c.unlocked, 0, "a DSLR word names no holder to release");
        if c.decision == Some(Decision::RollForward) {
            forward += 1;
            restored += c.restored;
        }
    }
    eprintln!(
        "dslr: {runs} runs, {} recoveries: {forward} logs rolled forward ({restored} records completed)",
        events.len()
    );
    assert!(
        restored > 0,
        "no crash fell between the redo log and a record WRITE"
    );
}

/// The planted recovery bug `dslr:skip-roll-forward` (logs discarded instead of rolled
/// forward) loses the WRITEs of a crashed transaction whose log had landed: the litmus
/// suite must see it. At the defaults (a crash in every run) it shows in 145 of 1,500
/// runs (`dmem litmus --protocol dslr:skip-roll-forward --seeds 300`); 60 seeds of each
/// litmus are plenty to see one.
#[test]
fn dslr_recovery_without_roll_forward_is_caught() {
    let cfg = dmem_occ::dslr2pl::DslrConfig {
        bug_skip_roll_forward: true,
        ..dmem_occ::dslr2pl::DslrConfig::default()
    };
    let p = OoccProtocol::dslr("dslr:skip-roll-forward", cfg);
    let mut caught = 0;
    for_each_run(&p, 60, |_, _, out| {
        if out.violation.is_some() {
            caught += 1;
        }
    });
    eprintln!("dslr:skip-roll-forward: {caught} of 180 runs caught");
    assert!(
        caught > 0,
        "the litmus suite missed a recovery that loses logged writes"
    );
}

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
/// its first commit (see [`KilledAtResolve`]); coordinator 0 on CN 0 reads both accounts
/// every 20 µs from 100 µs on, after recovery. Returns the merged history settled by
/// recovery's decisions (as `dmem cluster` settles it), the killed transaction and the
/// recovery events.
fn killed_at_resolve(protocol: &OoccProtocol) -> (History, TxnId, Vec<RecoveryEvent>) {
    const T: TableId = TableId(1);
    let shape = ClusterShape {
        mns: 2,
        cns: 2,
        threads: 1,
        seed: 1,
        profile: NicProfile::named("cx6").unwrap(),
        min_mn_bytes: 1 << 20,
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
    let timing = RecoveryTiming {
        heartbeat: 10_000,
        timeout: 50_000,
        poll: 5_000,
        until: 1_000_000,
    };
    d.start_recovery(&sim, 0, timing).unwrap();
    sim.run_until_idle();
    assert_eq!(d.recovery_error(), None);
    let killed = sink.killed.get().expect("the victim committed a transfer");
    let events = d.recovery_events();
    // Recovery's decisions settle the merged history, as `dmem cluster` does.
    for e in &events {
        for c in &e.coordinators {
            settle_history(&sink.history, c, e.finished_at);
        }
    }
    let history = sink.history.borrow().clone();
    (history, killed, events)
}

/// Issue #17 (a phantom version under DrTM's killed-CN recovery across processes): a
/// committed transaction must be resolved in the history before its redo log is truncated.
/// A CN killed after the truncation landed but before the resolution left an `Unknown`
/// transaction and no log; recovery settled it as aborted (no log, no decision) although
/// its records had landed, and the next read of them was a version no transaction of the
/// history installed. With the resolution first, the log of a CN killed at that instant is
/// still whole: recovery rolls it forward (onto no record: every one shows the new version)
/// and settles the transaction as committed.
#[test]
fn a_cn_killed_as_it_resolves_a_commit_leaves_its_log_to_recovery() {
    for p in [
        OoccProtocol::drtm("drtm", dmem_occ::drtm::DrtmConfig::default()),
        OoccProtocol::new("oocc", OoccConfig::default()),
        OoccProtocol::dslr("dslr", dmem_occ::dslr2pl::DslrConfig::default()),
    ] {
        let name = p.name();
        let (history, killed, events) = killed_at_resolve(&p);
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

//! CN crashes under Pandora's litmus tests: OOCC's redo logs roll forward a transaction
//! whose commit WRITEs had partly landed (some record already visible), every other
//! in-flight transaction is rolled back, stray locks are released, and no litmus assertion
//! or history check fails.

use std::cell::RefCell;

use dmem_deploy::{
    AnyContext, Decision, DeployError, DeploySpec, Deployment, MnMemory, Protocol, Recorder,
    RecoveryEvent, SimRecovery,
};
use dmem_litmus::{Litmus, RunConfig, RunOutcome, run_one};
use dmem_occ::OoccConfig;
use dmem_protocols::OoccProtocol;
use dmem_txn::{BoxCoordinator, Key, TableId};

thread_local! {
    static EVENTS: RefCell<Vec<RecoveryEvent>> = const { RefCell::new(Vec::new()) };
}

/// OOCC, with every deployment's recovery events kept for the test.
struct Recorded(OoccProtocol);

struct RecordedDeployment(Box<dyn Deployment>);

impl Drop for RecordedDeployment {
    fn drop(&mut self) {
        let events = self
            .0
            .sim_recovery()
            .map_or_else(Vec::new, |r| r.recovery_events());
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
    fn final_coordinator(
        &mut self,
        ctx: AnyContext,
        id: u16,
    ) -> Result<BoxCoordinator, DeployError> {
        self.0.final_coordinator(ctx, id)
    }
    fn read_final(&self, table: TableId, key: Key) -> Option<Vec<u8>> {
        self.0.read_final(table, key)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn sim_recovery(&mut self) -> Option<&mut dyn SimRecovery> {
        self.0.sim_recovery()
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

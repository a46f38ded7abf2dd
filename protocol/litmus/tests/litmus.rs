//! The litmus suite can fail: each of FORD's six bugs (Pandora Table 1), switched on
//! alone, is found by its litmus within 50 seeds at the default setting (a crash in every
//! run, default targeting and steering); fixed FORD and Pandora pass 100 seeds of every litmus
//! with a crash in every run, and each planted bug fails that same test; LOTUS and Motor
//! pass 50;
//! Motor's lock-releasing-only recovery is found. Runs are deterministic per seed.
//!
//! Bounds: 50 seeds, the goal for the default setting; the measured first failing seeds
//! are in the README.

use std::sync::Arc;

use dmem_deploy::Protocol;
use dmem_litmus::{
    Litmus, LitmusError, RunConfig, SuiteConfig, first_violation, run_one, run_suite,
};

/// A registered protocol by name.
fn protocol(name: &str) -> Arc<dyn Protocol> {
    dmem_protocols::registry().get(name).unwrap()
}

/// FORD with one bug of Pandora Table 1 switched on.
fn bug(b: FordBug) -> Arc<dyn Protocol> {
    protocol(&format!("ford:{}", b.name()))
}

/// The bugs of Pandora Table 1 by their registry names.
#[derive(Debug, Clone, Copy)]
enum FordBug {
    ComplicitAbort,
    MissingInsertLog,
    CovertLocks,
    RelaxedLocks,
    LostDecision,
    LogWithoutLock,
}

impl FordBug {
    fn name(self) -> &'static str {
        match self {
            FordBug::ComplicitAbort => "complicit-abort",
            FordBug::MissingInsertLog => "missing-insert-log",
            FordBug::CovertLocks => "covert-locks",
            FordBug::RelaxedLocks => "relaxed-locks",
            FordBug::LostDecision => "lost-decision",
            FordBug::LogWithoutLock => "log-without-lock",
        }
    }
}

impl std::fmt::Display for FordBug {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Asserts that `litmus` finds `b` within `bound` seeds, and that the failing seed
/// passes with the bug switched off (the violation is the bug's, not the suite's).
fn finds(b: FordBug, litmus: &[Litmus], bound: u64) {
    let cfg = RunConfig::new(1.0);
    let found = first_violation(&*bug(b), litmus, 0, bound, &cfg)
        .unwrap()
        .unwrap_or_else(|| panic!("{b}: no violation in {bound} seeds of {litmus:?}"));
    let fixed = protocol("ford");
    let again = run_one(&*fixed, found.litmus, found.seed, &cfg).unwrap();
    assert!(
        again.violation.is_none(),
        "{b}: fixed FORD fails seed {} too: {:?}",
        found.seed,
        again.violation
    );
}

#[test]
fn complicit_abort_is_found_by_litmus_1() {
    finds(
        FordBug::ComplicitAbort,
        &[
            Litmus::DirectWrite,
            Litmus::DirectWriteInsert,
            Litmus::DirectWriteDelete,
        ],
        COMPLICIT_ABORT_BOUND,
    );
}

#[test]
fn missing_insert_log_is_found_by_litmus_1_insert_and_delete() {
    finds(
        FordBug::MissingInsertLog,
        &[Litmus::DirectWriteInsert, Litmus::DirectWriteDelete],
        MISSING_INSERT_LOG_BOUND,
    );
}

#[test]
fn covert_locks_are_found_by_litmus_2() {
    finds(
        FordBug::CovertLocks,
        &[Litmus::ReadWrite],
        COVERT_LOCKS_BOUND,
    );
}

#[test]
fn relaxed_locks_are_found_by_litmus_2() {
    finds(
        FordBug::RelaxedLocks,
        &[Litmus::ReadWrite],
        RELAXED_LOCKS_BOUND,
    );
}

#[test]
fn lost_decision_is_found_by_litmus_3() {
    finds(
        FordBug::LostDecision,
        &[Litmus::IndirectWrite],
        LOST_DECISION_BOUND,
    );
}

#[test]
fn log_without_lock_is_found_by_litmus_3() {
    finds(
        FordBug::LogWithoutLock,
        &[Litmus::IndirectWrite],
        LOG_WITHOUT_LOCK_BOUND,
    );
}

/// Seeds of the "fixed FORD / Pandora pass" tests: with a crash in every run (default
/// targeting and steering) every planted bug shows in at least 3 % of seeds (README), so
/// these seeds catch a regression as likely as the rarest of them with probability
/// 1 − 0.97^100 ≈ 95 %; `every_planted_bug_fails_the_fixed_protocol_test` checks that
/// they catch each of the six.
const PASS_SEEDS: u64 = 100;

/// Seeds of the other protocols' pass tests (no planted FORD bug to catch).
const OTHER_PASS_SEEDS: u64 = 50;

fn passes(name: &str) {
    passes_with(name, OTHER_PASS_SEEDS);
}

fn passes_with(name: &str, seeds: u64) {
    let report = run_suite(
        &*protocol(name),
        &SuiteConfig {
            litmus: Litmus::ALL.to_vec(),
            first_seed: 0,
            seeds,
            run: RunConfig::new(1.0),
            threads: 2,
        },
    )
    .unwrap();
    assert_eq!(report.runs, 5 * seeds);
    assert_eq!(
        report.violations, 0,
        "{}: {:?}",
        report.protocol, report.first_failure
    );
    for s in &report.per_litmus {
        assert_eq!(s.crashes, seeds, "litmus {}: every run crashed", s.litmus);
        assert!(
            s.recovered >= seeds * 9 / 10,
            "litmus {}: recovery ran in {} of {seeds} runs",
            s.litmus,
            s.recovered
        );
        assert!(s.committed > 0, "litmus {}: nothing committed", s.litmus);
    }
}

#[test]
fn fixed_ford_passes_every_litmus_with_crashes() {
    passes_with("ford", PASS_SEEDS);
}

#[test]
fn pandora_passes_every_litmus_with_crashes() {
    passes_with("pandora", PASS_SEEDS);
}

/// The pass tests above can fail: each planted bug, run with their seeds and setting,
/// shows a violation (the first seed is printed by `seeds_to_find`, README).
#[test]
fn every_planted_bug_fails_the_fixed_protocol_test() {
    for b in [
        FordBug::ComplicitAbort,
        FordBug::MissingInsertLog,
        FordBug::CovertLocks,
        FordBug::RelaxedLocks,
        FordBug::LostDecision,
        FordBug::LogWithoutLock,
    ] {
        let found =
            first_violation(&*bug(b), &Litmus::ALL, 0, PASS_SEEDS, &RunConfig::new(1.0)).unwrap();
        assert!(
            found.is_some(),
            "{b}: no violation in the pass test's {PASS_SEEDS} seeds"
        );
    }
}

/// LOTUS (§6): a crashed CN loses its lock table; recovery decides its transactions from
/// their commit logs and only then releases its locks on the survivors.
#[test]
fn lotus_passes_every_litmus_with_crashes() {
    passes("lotus");
}

/// The planted recovery bug (locks of the failed CN released before its logs are decided)
/// is found, and the failing seed passes with the bug off.
#[test]
fn lotus_early_unlock_is_found() {
    let cfg = RunConfig::new(0.5);
    let found = first_violation(&*protocol("lotus:early-unlock"), &Litmus::ALL, 0, 200, &cfg)
        .unwrap()
        .expect("early-unlock: no violation in 200 seeds");
    let again = run_one(&*protocol("lotus"), found.litmus, found.seed, &cfg).unwrap();
    assert!(again.violation.is_none(), "{:?}", again.violation);
}

/// LOTUS §6 CN restart: the crashed CN comes back at once with an empty table and serves
/// only after its broadcast (recovery over).
#[test]
fn lotus_with_cn_restart_passes_every_litmus_with_crashes() {
    passes("lotus:restart=0");
}

/// The planted restart bug (the restarted CN serves before its recovery is over) is found,
/// and the failing seed passes with the bug off. Since the rejoin broadcast is a message
/// round trip, the early broadcast's window (the rest of the recovery, minus that round
/// trip and the survivor's lock request) is narrow on the suite's small cluster: 3 of
/// 15,000 runs (`dmem litmus --protocol lotus:restart-early --seeds 3000`), the first at
/// litmus 1 seed 283; this replays seeds 280–289 of litmus 1.
#[test]
fn lotus_restart_early_is_found() {
    let cfg = RunConfig::new(1.0);
    let found = first_violation(
        &*protocol("lotus:restart-early"),
        &[Litmus::DirectWrite],
        280,
        10,
        &cfg,
    )
    .unwrap()
    .expect("restart-early: no violation in litmus 1 seeds 280-289");
    let again = run_one(
        &*protocol("lotus:restart=0"),
        found.litmus,
        found.seed,
        &cfg,
    )
    .unwrap();
    assert!(again.violation.is_none(), "{:?}", again.violation);
}

#[test]
fn motor_passes_every_litmus_with_crashes() {
    passes("motor");
}

/// Judged as snapshot isolation (write skew allowed by litmus 2's assertion and the
/// checker).
#[test]
fn motor_under_snapshot_isolation_passes_every_litmus_with_crashes() {
    passes("motor-si");
}

/// Motor's public code only releases a crashed coordinator's locks; a commit cut between
/// its post lists then stays half installed. The litmus suite must see that (seed 3 of
/// litmus 1 in the README's measurement).
#[test]
fn motor_recovery_that_only_releases_locks_is_found() {
    let cfg = RunConfig::new(0.5);
    let found = first_violation(
        &*protocol("motor:recovery-releases-only"),
        &[Litmus::DirectWrite],
        0,
        20,
        &cfg,
    )
    .unwrap()
    .expect("no violation in 20 seeds of litmus 1");
    let again = run_one(&*protocol("motor"), found.litmus, found.seed, &cfg).unwrap();
    assert!(again.crash.is_some(), "the failing run crashed a CN");
    assert!(
        again.violation.is_none(),
        "Motor with its install-finishing recovery fails seed {} too: {:?}",
        found.seed,
        again.violation
    );
}

#[test]
fn a_seed_replays_the_same_run() {
    let t = bug(FordBug::CovertLocks);
    let cfg = RunConfig::new(0.7);
    for l in Litmus::ALL {
        for seed in 0..4 {
            assert_eq!(
                run_one(&*t, l, seed, &cfg).unwrap(),
                run_one(&*t, l, seed, &cfg).unwrap()
            );
        }
    }
}

#[test]
fn suite_results_do_not_depend_on_threads() {
    let t = bug(FordBug::ComplicitAbort);
    let run = |threads| {
        let mut r = run_suite(
            &*t,
            &SuiteConfig {
                litmus: vec![Litmus::IndirectWrite, Litmus::DirectWrite],
                first_seed: 3,
                seeds: 12,
                run: RunConfig::new(0.5),
                threads,
            },
        )
        .unwrap();
        r.wall_s = 0.0;
        r
    };
    assert_eq!(run(1), run(2));
}

#[test]
fn bad_settings_are_errors() {
    let t = protocol("pandora");
    let suite = |seeds, p| SuiteConfig {
        litmus: vec![Litmus::ReadWrite],
        first_seed: 0,
        seeds,
        run: RunConfig::new(p),
        threads: 1,
    };
    assert!(matches!(
        run_suite(&*t, &suite(0, 0.5)),
        Err(LitmusError::NoSeeds)
    ));
    assert!(matches!(
        run_suite(&*t, &suite(1, 1.5)),
        Err(LitmusError::CrashProb(_))
    ));
    assert!(matches!(
        run_suite(&*t, &suite(1, -0.1)),
        Err(LitmusError::CrashProb(_))
    ));
    let mut bad = suite(1, 0.5);
    bad.run.steer = 1.5;
    assert!(matches!(run_suite(&*t, &bad), Err(LitmusError::Config(_))));
    let mut bad = suite(1, 0.5);
    bad.run.message_faults.loss = -0.5;
    assert!(matches!(run_suite(&*t, &bad), Err(LitmusError::Config(_))));
    let mut bad = suite(1, 0.5);
    bad.run.commit_slot = 0;
    assert!(matches!(run_suite(&*t, &bad), Err(LitmusError::Config(_))));
}

// The suite's default setting (crash in every run, 0.9 of the crashes aimed at phases,
// 0.9 of the instances steered) finds every bug within 50 seeds of its Table 1 litmus
// tests; the first failing seeds (README, `seeds_to_find -- 4000 1.0 0.9 0.9`) are noted.
const COMPLICIT_ABORT_BOUND: u64 = 50; // first: seed 0 (1-delete)
const MISSING_INSERT_LOG_BOUND: u64 = 50; // first: seed 2 (1-delete)
const COVERT_LOCKS_BOUND: u64 = 50; // first: seed 4
const RELAXED_LOCKS_BOUND: u64 = 50; // first: seed 4
const LOST_DECISION_BOUND: u64 = 50; // first: seed 11
const LOG_WITHOUT_LOCK_BOUND: u64 = 50; // first: seed 8

/// Messages are lost only in runs of a protocol that claims to tolerate it (LOTUS's
/// RPCs time out, §3; Dandelion's are retransmitted), and duplicated only for one that
/// claims that (Dandelion executes a request number once); the others get delays only.
#[test]
fn only_claimed_message_faults_are_injected() {
    for name in ["lotus", "dnl-4", "dnl-2", "dnl-1", "fasst"] {
        assert!(protocol(name).tolerates_message_loss(), "{name}");
    }
    for name in ["ford", "pandora", "motor", "oocc"] {
        assert!(!protocol(name).tolerates_message_loss(), "{name}");
    }
    for name in ["dnl-4", "dnl-2", "dnl-1", "fasst"] {
        assert!(protocol(name).tolerates_message_duplication(), "{name}");
    }
    for name in ["lotus", "ford", "pandora", "motor", "oocc"] {
        assert!(!protocol(name).tolerates_message_duplication(), "{name}");
    }
    let cfg = RunConfig::new(1.0);
    assert!(cfg.loss_if_tolerated > 0.0 && cfg.message_faults.loss == 0.0);
    assert!(cfg.dup_if_tolerated > 0.0);
    assert!(cfg.message_faults.delay > 0.0 && cfg.message_faults.duplicate == 0.0);
}

/// A detector that suspects live CNs: heartbeats rarer than the timeout, no crash. Every
/// worker CN is falsely suspected; recovery cuts it off every MN before it decides its
/// coordinators' transactions, so the runs lose availability (cut-off roles stop
/// committing), never safety: no assertion or checker violation, for every protocol that
/// recovers behind `dmem-deploy`'s heartbeat detector.
#[test]
fn false_suspicions_cost_availability_not_safety() {
    let mut run = RunConfig::new(0.0);
    run.live_cut_off_allowed = true;
    // DSLR refuses detection slower than a quarter of its 1 ms reset lease: 150 + 50 + 5.
    run.timing.heartbeat = 150_000;
    run.timing.timeout = 50_000;
    run.timing.poll = 5_000;
    for name in ["oocc", "drtm", "dslr", "motor"] {
        let (mut runs, mut suspected) = (0, 0);
        for litmus in Litmus::ALL {
            for seed in 0..40 {
                let out = run_one(&*protocol(name), litmus, seed, &run).unwrap();
                assert!(out.crash.is_none());
                assert!(
                    out.violation.is_none(),
                    "{name} {litmus:?} seed {seed}: {:?}",
                    out.violation
                );
                runs += 1;
                suspected += out.recoveries;
            }
        }
        // Two worker CNs per run, each suspected once.
        assert_eq!(suspected, 2 * runs, "{name}");
    }
}

/// Regression (Dandelion with the planted `no-dedup` bug): in these two seeds the bug
/// leaks locks, the litmus transactions retry past the run's 2 ms, and the crash instant
/// (drawn up to the crash-free run's last transaction end) falls after 2 ms, when the
/// failure detector had already stopped. The crashed server was never declared crashed
/// and its peers re-sent their requests to it forever: the run never went idle and
/// `dmem litmus` hung. Now the detector keeps watching while a live server waits for an
/// answer, so the crash is recovered and the run is judged (the bug's violations remain).
#[test]
fn a_late_server_crash_is_recovered_not_waited_for_forever() {
    let dnl = protocol("dnl:4+no-dedup");
    let cfg = RunConfig::new(1.0);
    for (litmus, seed) in [
        (Litmus::DirectWriteInsert, 33),
        (Litmus::DirectWriteDelete, 126),
    ] {
        let out = run_one(&*dnl, litmus, seed, &cfg).unwrap();
        let crash = out.crash.expect("a crash in every run");
        assert!(
            crash.work_request > cfg.timing.until,
            "{litmus:?} seed {seed}: the crash instant {} is no longer after the run's end",
            crash.work_request
        );
        assert_eq!(out.recoveries, 1, "{litmus:?} seed {seed}");
        let stuck = out
            .violation
            .as_ref()
            .is_some_and(|v| v.reason.starts_with("stuck"));
        assert!(!stuck, "{litmus:?} seed {seed}: {:?}", out.violation);
    }
}

/// A run that cannot finish within `settle` of virtual time after the run is reported as
/// stuck, never simulated without end: with no time to settle, the assertion transaction
/// (started at the run's end) cannot finish.
#[test]
fn a_run_that_cannot_finish_is_reported_stuck() {
    let mut cfg = RunConfig::new(0.0);
    cfg.settle = 0;
    let out = run_one(&*protocol("dnl-4"), Litmus::DirectWrite, 1, &cfg).unwrap();
    let v = out.violation.expect("stuck");
    assert!(v.reason.starts_with("stuck"), "{}", v.reason);
}

//! One executor per core running the same DecLock code on the shm fabric: the polling
//! executor always, glommio (pinned, io_uring) with the `glommio` feature.

mod common;

use common::declock_shm::{Outcome, Workload, run};
use dmem_runtime::ExecutorKind;

fn workload() -> Workload {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    Workload {
        cores: (0..2).map(|i| i % cpus).collect(),
        clients_per_core: 3,
        locks: 2,
        ops: 150,
        duration_ns: 20_000_000_000,
    }
}

fn check(kind: ExecutorKind, o: Outcome) {
    assert_eq!(
        o.acquisitions,
        2 * 3 * 150,
        "{kind:?}: every client did its acquisitions"
    );
    assert_eq!(
        o.counters, o.acquisitions,
        "{kind:?}: a lost counter update means two clients held a lock at once"
    );
}

#[test]
fn declock_on_shm_under_the_polling_executor_per_core() {
    check(
        ExecutorKind::Polling,
        run(ExecutorKind::Polling, &workload()),
    );
}

#[cfg(feature = "glommio")]
#[test]
fn declock_on_shm_under_glommio_pinned_per_core() {
    // Where glommio cannot start, say why instead of failing on the environment.
    if let Err(why) = dmem_runtime::glommio_probe() {
        glommio_unavailable(&why);
        return;
    }
    check(
        ExecutorKind::Glommio,
        run(ExecutorKind::Glommio, &workload()),
    );
}

#[cfg(feature = "glommio")]
#[test]
fn detect_prefers_glommio_where_it_starts() {
    let (kind, why) = ExecutorKind::detect();
    match dmem_runtime::glommio_probe() {
        Ok(()) => assert_eq!((kind, why), (ExecutorKind::Glommio, None)),
        Err(_) => assert_eq!(kind, ExecutorKind::Polling),
    }
}

#[cfg(not(feature = "glommio"))]
#[test]
fn without_the_feature_detect_falls_back_to_polling_and_says_why() {
    let (kind, why) = ExecutorKind::detect();
    assert_eq!(kind, ExecutorKind::Polling);
    assert_eq!(why.as_deref(), Some("built without the `glommio` feature"));
}

/// Each glommio executor's thread may run only on its job's CPU (the kernel's affinity
/// list for the thread, read inside the job).
#[cfg(feature = "glommio")]
#[test]
fn glommio_executors_are_pinned_to_their_cpu() {
    if let Err(why) = dmem_runtime::glommio_probe() {
        glommio_unavailable(&why);
        return;
    }
    let cpus = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(2);
    let jobs = (0..cpus)
        .map(|cpu| {
            (cpu, move |_clock| async move {
                let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
                status
                    .lines()
                    .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                    .map(|v| v.trim().to_owned())
                    .unwrap()
            })
        })
        .collect();
    let allowed = dmem_runtime::run_per_core(ExecutorKind::Glommio, jobs).unwrap();
    let expected: Vec<String> = (0..cpus).map(|c| c.to_string()).collect();
    assert_eq!(allowed, expected);
}

#[test]
fn executor_choices_parse_and_resolve() {
    use dmem_runtime::ExecutorChoice;
    for name in ExecutorChoice::NAMES {
        assert!(ExecutorChoice::from_name(name).is_ok(), "{name}");
    }
    let err = ExecutorChoice::from_name("tokio").unwrap_err();
    assert_eq!(
        err,
        "executor `tokio` is not `auto`, `polling` or `glommio`"
    );
    assert_eq!(
        ExecutorChoice::Polling.resolve().unwrap().0,
        ExecutorKind::Polling
    );
    // Auto always resolves; glommio resolves exactly when auto picks it.
    let (auto, why) = ExecutorChoice::Auto.resolve().unwrap();
    assert_eq!(why.is_none(), auto != ExecutorKind::Polling);
    match ExecutorChoice::Glommio.resolve() {
        Ok((kind, _)) => assert_eq!(kind, auto),
        Err(e) => {
            assert_eq!(auto, ExecutorKind::Polling);
            assert!(e.contains("--features glommio"), "{e}");
        }
    }
}

/// `RealClock` (which the fabrics' contexts sleep on) sleeps on whichever executor a
/// `run_per_core` job runs on: the polling executor's timers, or glommio's. Each job sleeps
/// 5 ms twice, with a `CoreClock` sleep between them, and measures the time it took.
fn real_clock_sleeps_on(kind: ExecutorKind) {
    use dmem_verbs::Clock as _;
    let jobs = (0..2)
        .map(|cpu| {
            (
                cpu % std::thread::available_parallelism().map_or(1, |n| n.get()),
                {
                    move |clock: dmem_runtime::CoreClock| async move {
                        let start = dmem_runtime::monotonic_now();
                        dmem_runtime::RealClock.sleep(5_000_000).await;
                        clock.sleep(1_000_000).await;
                        dmem_runtime::RealClock
                            .sleep_until(dmem_runtime::monotonic_now() + 5_000_000)
                            .await;
                        dmem_runtime::monotonic_now() - start
                    }
                },
            )
        })
        .collect();
    for took in dmem_runtime::run_per_core(kind, jobs).expect("executors start") {
        assert!(
            took >= 11_000_000,
            "{kind:?}: slept {took} ns, less than asked"
        );
    }
}

#[test]
fn real_clock_sleeps_under_the_polling_executor_per_core() {
    real_clock_sleeps_on(ExecutorKind::Polling);
}

#[cfg(feature = "glommio")]
#[test]
fn real_clock_sleeps_under_glommio_per_core() {
    if let Err(why) = dmem_runtime::glommio_probe() {
        glommio_unavailable(&why);
        return;
    }
    real_clock_sleeps_on(ExecutorKind::Glommio);
}

/// Where glommio cannot start: a failure when `DMEM_TESTS_REQUIRE_ENV` is set (CI),
/// otherwise the reason printed, and the caller returns.
#[cfg(feature = "glommio")]
fn glommio_unavailable(why: &dyn std::fmt::Display) {
    assert!(
        std::env::var_os("DMEM_TESTS_REQUIRE_ENV").is_none(),
        "glommio does not start here: {why} (DMEM_TESTS_REQUIRE_ENV is set)"
    );
    eprintln!("skipped: glommio does not start here: {why}");
}

//! `dmem recover` end to end on tiny data sets: a CN crashes mid-run, recovery finishes,
//! and the history checker and the workload's invariants pass.

use std::process::Command;

fn dmem(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_dmem"))
        .args(args)
        .output()
        .expect("the dmem binary runs")
}

fn recover(protocol: &str, workload: &str, crash: &str, cns: &str) -> serde_json::Value {
    recover_with(protocol, workload, &["--crash", crash, "--cns", cns])
}

fn recover_with(protocol: &str, workload: &str, extra: &[&str]) -> serde_json::Value {
    recover_with_coroutines(protocol, workload, extra, "2")
}

fn recover_with_coroutines(
    protocol: &str,
    workload: &str,
    extra: &[&str],
    coroutines: &str,
) -> serde_json::Value {
    let mut args = vec![
        "recover",
        "--protocol",
        protocol,
        "--workload",
        workload,
        "--scale",
        "tiny",
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[
        "--threads",
        "2",
        "--coroutines",
        coroutines,
        "--crash-at-ms",
        "2",
        "--duration-ms",
        "5",
        "--detect-timeout-us",
        "500",
        "--heartbeat-us",
        "100",
        "--json",
    ]);
    let out = dmem(&args);
    assert!(
        out.status.success(),
        "{protocol}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // JSON lines: the report, then the summary.
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    serde_json::from_str(stdout.lines().next().expect("a report line")).expect("one JSON object")
}

fn assert_recovered(r: &serde_json::Value) {
    assert_eq!(r["checker"], "ok", "{r}");
    assert_eq!(r["invariants"], "ok", "{r}");
    assert!(r["recovery_latency_us"].as_f64().unwrap() > 0.0, "{r}");
    let detection = r["detection_us"].as_f64().unwrap();
    assert!(detection > 0.0 && detection <= 500.0 + 10.0, "{r}");
    assert!(r["recovered_txns"].as_u64().unwrap() > 0, "{r}");
    let series = r["series"].as_array().unwrap();
    assert_eq!(series.len(), 5);
    assert!(series[0].as_u64().unwrap() > 0, "{r}");
    assert!(
        series[4].as_u64().unwrap() > 0,
        "the survivors run after recovery: {r}"
    );
}

#[test]
fn pandora_recovers_a_crashed_cn_in_microseconds() {
    let r = recover("pandora", "smallbank", "cn", "2");
    assert_recovered(&r);
    assert_eq!(r["protocol"], "pandora");
    assert_eq!(r["scanned_locks"], 0);
}

#[test]
fn ford_scans_the_store_while_the_world_stops() {
    let r = recover("ford", "smallbank", "cn", "2");
    assert_recovered(&r);
    let latency = r["recovery_latency_us"].as_f64().unwrap();
    let scan = r["scan_us"].as_f64().unwrap();
    assert!(
        scan > r["log_recovery_us"].as_f64().unwrap(),
        "the scan dominates: {r}"
    );
    assert!(scan <= latency, "{r}");
}

/// Committed in the run's last ms over the mean of the ms before the crash at 2 ms.
fn back_to_before(r: &serde_json::Value) -> f64 {
    let series: Vec<f64> = r["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let before = (series[0] + series[1]) / 2.0;
    series[series.len() - 1] / before
}

#[test]
fn pandora_restarted_cn_brings_throughput_back() {
    // Pandora §6.3 (Fig. 8's second line): one of three CNs crashes at 2 ms, is recovered,
    // and comes back 100 µs after its failure was detected with new coordinator ids.
    for protocol in ["pandora", "ford"] {
        let r = recover_with(
            protocol,
            "smallbank",
            &["--cns", "3", "--restart-after-us", "100"],
        );
        assert_recovered(&r);
        assert_eq!(r["protocol"], format!("{protocol}:restart=100"), "{r}");
        assert_eq!(r["restarted_cns"], 1, "{r}");
        assert_eq!(
            r["restarted_coordinators"], 4,
            "2 threads x 2 coroutines: {r}"
        );
        assert!(r["restarted_committed"].as_u64().unwrap() > 0, "{r}");
        let serving = r["serving_again_us"].as_f64().unwrap();
        assert!(
            (100.0..3_000.0).contains(&serving),
            "back after the detection and the restart delay: {r}"
        );
        assert!(
            back_to_before(&r) >= 0.9,
            "{protocol}: the last ms commits at least 90 % of before the crash: {r}"
        );
    }
    // Without the restart, one CN in three stays lost.
    let r = recover_with("pandora", "smallbank", &["--cns", "3"]);
    assert!(back_to_before(&r) < 0.8, "{r}");
}

/// One of three CNs (2 threads x 8 coroutines) crashes at 2 ms, restarts 100 µs after its
/// failure was detected, and its restarted incarnation crashes again at 3 ms with
/// transactions in flight; the report after both recoveries.
fn crash_restart_crash(protocol: &str) -> serde_json::Value {
    recover_with_coroutines(
        protocol,
        "smallbank",
        &[
            "--crash-cns",
            "1",
            "--cns",
            "3",
            "--restart-after-us",
            "100",
            "--crash-again-at-ms",
            "3",
        ],
        "8",
    )
}

/// What every protocol that restarts CNs must show after [`crash_restart_crash`]: both
/// crashes recovered, the restarted incarnations committed, history and invariants clean.
fn assert_recovered_twice(r: &serde_json::Value) {
    assert_eq!(r["checker"], "ok", "{r}");
    assert_eq!(r["invariants"], "ok", "{r}");
    assert_eq!(r["second_crash_recovered"], 1, "{r}");
    assert!(
        r["second_recovery_latency_us"].as_f64().unwrap() > 0.0,
        "{r}"
    );
    assert!(
        r["second_recovered_txns"].as_u64().unwrap() > 0,
        "the second crash caught the new incarnation's transactions in flight: {r}"
    );
    assert_eq!(r["restarted_cns"], 2, "restarted twice: {r}");
    assert_eq!(r["restarted_coordinators"], 32, "{r}");
    assert!(r["restarted_committed"].as_u64().unwrap() > 0, "{r}");
}

#[test]
fn pandora_restarted_cn_that_crashes_again_is_recovered_again() {
    // The restarted incarnation (new coordinator ids, joined to the failure detector) is
    // suspected, its transactions decided, and it restarts again.
    assert_recovered_twice(&crash_restart_crash("pandora"));
}

#[test]
fn half_of_the_coordinators_crash_under_lock_logging_on_tatp() {
    let r = recover("pandora-lock-logging", "tatp", "half", "4");
    assert_recovered(&r);
    assert_eq!(r["crashed_cns"], 2);
}

#[test]
fn lotus_restarted_cn_serves_its_shards_again_after_its_broadcast() {
    // LOTUS §6: one of three CNs crashes, survivors recover it, it restarts 300 µs after
    // detection with an empty lock table and serves again only after its broadcast.
    let r = recover_with(
        "lotus",
        "smallbank",
        &[
            "--crash-cns",
            "1",
            "--cns",
            "3",
            "--restart-after-us",
            "300",
        ],
    );
    assert_recovered(&r);
    assert_eq!(r["restarted_cns"], 1, "{r}");
    let serving = r["serving_again_us"].as_f64().unwrap();
    assert!(
        serving >= r["detection_us"].as_f64().unwrap() + 300.0,
        "serving only after the restart: {r}"
    );
    assert_eq!(r["early_broadcasts"], 0, "{r}");
    assert_eq!(r["restart_grants_before_recovered"], 0, "{r}");
    assert!(
        r["restart_grants_after"].as_u64().unwrap() > 0,
        "the restarted CN grants its shards' locks again: {r}"
    );
    // It runs its coordinators again (2 threads × 2 coroutines), whose commits count.
    assert_eq!(r["restarted_coordinators"], 4, "{r}");
    assert_eq!(r["stale_fences"], 0, "{r}");
    assert!(
        r["restarted_committed"].as_u64().unwrap() > 0,
        "the restarted CN's coordinators commit: {r}"
    );
}

#[test]
fn lotus_restarted_cn_that_crashes_again_is_recovered_again() {
    // Crash at 2 ms, restart 100 µs after detection, crash of the restarted incarnation at
    // 3 ms (its coordinators mid-flight, its table holding their locks), restart again:
    // the second recovery decides the new incarnation's logs, releases its locks, and the
    // history and invariants stay clean.
    // 16 coordinators on the CN, so that the second crash catches some mid-commit.
    let r = crash_restart_crash("lotus");
    assert_recovered_twice(&r);
    assert_eq!(r["stale_fences"], 0, "{r}");
    assert_eq!(r["early_broadcasts"], 0, "{r}");
    assert_eq!(r["restart_grants_before_recovered"], 0, "{r}");
}

#[test]
fn lotus_two_restarted_cns_serve_each_other() {
    // Two of four CNs crash together and restart at once: each one's rejoin broadcast must
    // reach the other (or the other's fresh table must not fence it), or its coordinators
    // are refused there for good.
    let r = recover_with(
        "lotus",
        "smallbank",
        &["--crash-cns", "2", "--cns", "4", "--restart-after-us", "0"],
    );
    assert_eq!(r["checker"], "ok", "{r}");
    assert_eq!(r["invariants"], "ok", "{r}");
    assert_eq!(r["restarted_cns"], 2, "{r}");
    assert_eq!(r["restarted_coordinators"], 8, "{r}");
    assert_eq!(r["stale_fences"], 0, "{r}");
}

#[test]
fn motor_restarted_cn_runs_its_coordinators_again_at_full_throughput() {
    // Motor: one of two CNs crashes at 2 ms, its op logs are recovered, it comes back
    // 1000 µs after detection with its coordinators under their old ids (new transaction
    // ids), and the run ends at the throughput it had before the crash.
    let r = recover_with(
        "motor",
        "smallbank",
        &["--crash", "cn", "--cns", "2", "--restart-after-us", "1000"],
    );
    assert_eq!(r["checker"], "ok", "{r}");
    assert_eq!(r["invariants"], "ok", "{r}");
    assert_eq!(r["restarted_cns"], 1, "{r}");
    assert!(r["restarted_coordinators"].as_u64().unwrap() > 0, "{r}");
    assert!(
        r["restarted_committed"].as_u64().unwrap() > 0,
        "the restarted CN's coordinators commit: {r}"
    );
    let serving = r["serving_again_us"].as_f64().unwrap();
    assert!(
        serving >= r["detection_us"].as_f64().unwrap() + 1000.0,
        "serving only after the restart: {r}"
    );
    // ms 1 (before the crash at 2 ms) against ms 4 (the last, restarted CN serving).
    let series = r["series"].as_array().unwrap();
    let (before, end) = (series[1].as_u64().unwrap(), series[4].as_u64().unwrap());
    assert!(
        end * 10 >= before * 9,
        "throughput back to ≥ 90 % of before the crash: {end} vs {before}: {r}"
    );
}

#[test]
fn motor_restarted_cn_that_crashes_again_is_recovered_again() {
    // The heartbeat detector, watching the restarted CN again, suspects it, recovery decides
    // its op logs, and it restarts once more.
    assert_recovered_twice(&crash_restart_crash("motor"));
}

#[test]
fn lotus_restarted_coordinators_reusing_old_ids_are_caught() {
    // Planted bug: the restarted CN's coordinators number their transactions from 1 again,
    // so two transactions share an id (and a commit-log writer) across incarnations.
    let out = dmem(&[
        "recover",
        "--protocol",
        "lotus:restart-same-ids",
        "--workload",
        "smallbank",
        "--scale",
        "tiny",
        "--crash-cns",
        "1",
        "--cns",
        "3",
        "--restart-after-us",
        "100",
        "--threads",
        "2",
        "--coroutines",
        "2",
        "--crash-at-ms",
        "2",
        "--duration-ms",
        "4",
        "--detect-timeout-us",
        "500",
        "--heartbeat-us",
        "100",
        "--json",
    ]);
    assert!(!out.status.success(), "the checker must fail");
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    let r: serde_json::Value =
        serde_json::from_str(stdout.lines().next().expect("a report line")).expect("JSON");
    assert_ne!(r["checker"], "ok", "{r}");
}

#[test]
fn restart_after_is_refused_for_a_protocol_without_cn_restart() {
    // Dandelion's servers are symmetric: there is no CN to bring back.
    let out = dmem(&[
        "recover",
        "--scale",
        "tiny",
        "--protocol",
        "dnl-4",
        "--restart-after-us",
        "10",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("restart crashed CNs") && err.contains("dnl-4"),
        "{err}"
    );
}

#[test]
fn bad_flags_give_one_readable_line() {
    for (flag, value, expect) in [
        ("--crash", "mn", "[possible values: cn, half]"),
        ("--protocol", "ford:covert-locks", "dmem recover runs"),
        ("--crash-at-ms", "40", "must fall before --duration-ms"),
    ] {
        let out = dmem(&["recover", "--scale", "tiny", flag, value]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.starts_with("dmem: error:") && err.contains(expect) && err.lines().count() == 1,
            "{flag} {value}: {err}"
        );
    }
}

//! `dmem bench --workload ...` end to end on tiny data sets.

#[path = "support/run.rs"]
mod run;

use run::{dmem, json_rows};

/// The JSON rows of a `dmem bench --json` run that succeeded.
fn bench_rows(args: &[&str]) -> Vec<serde_json::Value> {
    json_rows(&dmem(args))
}

#[test]
fn ford_and_pandora_run_smallbank_and_pass_the_checker_and_invariants() {
    let rows = bench_rows(&[
        "bench",
        "--workload",
        "smallbank",
        "--scale",
        "tiny",
        "--protocol",
        "ford,pandora",
        "--cns",
        "2",
        "--threads",
        "2",
        "--coroutines",
        "4",
        "--duration-ms",
        "1",
        "--json",
    ]);
    assert_eq!(rows.len(), 2);
    for (row, protocol) in rows.iter().zip(["ford", "pandora"]) {
        assert_eq!(row["protocol"], protocol);
        assert_eq!(row["checker"], "ok", "{row}");
        assert_eq!(row["invariants"], "ok", "{row}");
        assert!(row["committed"].as_u64() > Some(0), "{row}");
        assert!(row["mtps"].as_f64().unwrap() > 0.0);
        assert!(row["checked_txns"].as_u64().unwrap() > 100);
        for field in ["abort_rate", "p50_us", "p99_us"] {
            assert!(row[field].is_number(), "{field} in {row}");
        }
        // Round trips per committed transaction: all, and per SmallBank type.
        assert!(row["rtts_per_txn"]["all"].as_f64().unwrap() >= 2.0, "{row}");
        assert!(
            row["rtts_per_txn"]["SendPayment"].as_f64().unwrap() >= 2.0,
            "{row}"
        );
    }
}

#[test]
fn tatp_runs_on_ford() {
    let rows = bench_rows(&[
        "bench",
        "--workload",
        "tatp",
        "--scale",
        "tiny",
        "--protocol",
        "ford",
        "--cns",
        "1",
        "--threads",
        "2",
        "--coroutines",
        "2",
        "--duration-ms",
        "1",
        "--json",
    ]);
    assert_eq!(rows[0]["checker"], "ok", "{}", rows[0]);
    assert_eq!(rows[0]["invariants"], "ok", "{}", rows[0]);
    // The verdicts judged something: transactions of several TATP types committed.
    assert!(rows[0]["committed"].as_u64() > Some(50), "{}", rows[0]);
    let types = rows[0]["committed_per_type"].as_object().unwrap();
    assert!(
        types.values().filter(|n| n.as_u64() > Some(0)).count() >= 3,
        "{}",
        rows[0]
    );
}

#[test]
fn tpcc_runs_the_oocc_mix_on_the_occ_family() {
    let rows = bench_rows(&[
        "bench",
        "--workload",
        "tpcc",
        "--mix",
        "oocc",
        "--scale",
        "tiny",
        "--protocol",
        "oocc:lease=80,dslr",
        "--cns",
        "1",
        "--threads",
        "2",
        "--coroutines",
        "2",
        "--duration-ms",
        "1",
        "--json",
    ]);
    assert_eq!(rows.len(), 2);
    for row in &rows {
        assert_eq!(row["workload"], "tpcc", "{row}");
        assert_eq!(row["checker"], "ok", "{row}");
        assert_eq!(row["invariants"], "ok", "{row}");
        assert!(row["committed"].as_u64() > Some(0), "{row}");
    }
}

#[test]
fn bad_arguments_are_refused_in_one_line() {
    for (args, expected) in [
        (
            vec!["bench", "--protocol", "dandelion"],
            "unknown protocol `dandelion`",
        ),
        (vec!["bench", "--protocol", "ford:torn-reads"], "torn-reads"),
        (
            vec!["bench", "--scale", "huge"],
            "[possible values: tiny, small, ford, motor, lotus]",
        ),
        (
            vec!["bench", "--workload", "tpch"],
            "invalid value 'tpch' for '--workload <WORKLOAD>'",
        ),
        (vec!["bench", "--coroutines", "0"], "0 is not in 1..=1024"),
        (
            vec!["bench", "--workload", "tpcc", "--mix", "a"],
            "unknown --mix `a` for tpcc: use oocc",
        ),
        (
            vec!["bench", "--workload", "tatp", "--mix", "a"],
            "--mix applies to --workload ycsb, tpcc and append only",
        ),
        (
            vec!["bench", "--fabric", "rdma"],
            if cfg!(feature = "rdma") {
                "no RDMA device found"
            } else {
                "this dmem was built without RDMA support"
            },
        ),
        (
            vec!["bench", "--fabric", "ib"],
            "[possible values: sim, tcp, shm, rdma]",
        ),
    ] {
        let out = dmem(&args);
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

#[test]
fn dandelion_and_fasst_run_on_shm_in_one_process() {
    let rows = bench_rows(&[
        "bench",
        "--fabric",
        "shm",
        "--workload",
        "smallbank",
        "--scale",
        "tiny",
        "--protocol",
        "dnl-4,fasst",
        "--servers",
        "2",
        "--threads",
        "1",
        "--coroutines",
        "2",
        "--duration-ms",
        "1000",
        "--attempts",
        "1",
        "--json",
    ]);
    // Per protocol its row of the schema every fabric prints, then this process's node
    // row (CPU time, messages, load).
    assert_eq!(rows.len(), 4);
    let (protocol_rows, node_rows): (Vec<_>, Vec<_>) =
        rows.iter().partition(|r| r.get("node").is_none());
    for (row, protocol) in protocol_rows.iter().zip(["dnl-4", "fasst"]) {
        assert_eq!(row["protocol"], protocol);
        assert_eq!(row["checker"], "ok", "{row}");
        assert_eq!(row["invariants"], "ok", "{row}");
        assert!(row["committed"].as_u64().unwrap() > 0, "{row}");
        assert!(row["mtps"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["mn_reads_per_txn"].is_null(), "{row}");
    }
    for (row, protocol) in node_rows.iter().zip(["dnl-4", "fasst"]) {
        assert_eq!(row["protocol"], protocol);
        assert_eq!(row["node"], "process", "{row}");
        assert_eq!(row["fabric"], "shm");
        assert_eq!(row["checker"], "ok", "{row}");
        assert_eq!(row["invariants"], "ok", "{row}");
        assert!(row["committed"].as_u64().unwrap() > 0, "{row}");
        assert!(row["load_average"].is_string(), "{row}");
        // One try each: every abort (by reason) gave its transaction up (by error).
        assert_eq!(row["attempts"], 1, "{row}");
        let sum = |field: &str| {
            row.get(field)
                .and_then(|m| m.as_object())
                .map_or(0, |m| m.values().map(|n| n.as_u64().unwrap()).sum::<u64>())
        };
        assert_eq!(
            sum("aborts_by_reason"),
            row["given_up"].as_u64().unwrap(),
            "{row}"
        );
        assert_eq!(
            sum("given_up_by_error"),
            row["given_up"].as_u64().unwrap(),
            "{row}"
        );
    }
    assert_eq!(node_rows[1]["msgs_per_packet"].as_f64(), Some(1.0));
    assert_eq!(protocol_rows[1]["msgs_per_packet"].as_f64(), Some(1.0));
    // Symmetric servers run in this process, the others as MN and CN processes: not mixed.
    let out = dmem(&[
        "bench",
        "--fabric",
        "shm",
        "--protocol",
        "dnl-4,ford",
        "--scale",
        "tiny",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("bench them separately"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn dandelion_under_lost_and_duplicated_messages_resends_and_stays_serializable() {
    let run = |faults: &[&str]| {
        let mut args = vec![
            "bench",
            "--workload",
            "smallbank",
            "--scale",
            "tiny",
            "--protocol",
            "dnl-4",
            "--servers",
            "3",
            "--threads",
            "2",
            "--coroutines",
            "4",
            "--duration-ms",
            "1",
            "--json",
        ];
        args.extend_from_slice(faults);
        let rows = bench_rows(&args);
        assert_eq!(rows.len(), 1);
        rows.into_iter().next().unwrap()
    };
    let clean = run(&[]);
    let faulty = run(&["--msg-loss", "0.02", "--msg-dup", "0.02"]);
    for row in [&clean, &faulty] {
        assert_eq!(row["checker"], "ok", "{row}");
        assert_eq!(row["invariants"], "ok", "{row}");
        assert!(row["committed"].as_u64().unwrap() > 100, "{row}");
    }
    let counter = |row: &serde_json::Value, name: &str| row["counters"][name].as_u64().unwrap();
    // Without faults nothing is re-sent; with them, lost requests or replies are re-sent
    // and duplicated requests answered from the reply cache.
    assert_eq!(counter(&clean, "retransmissions"), 0, "{clean}");
    assert!(counter(&faulty, "retransmissions") > 0, "{faulty}");
    assert!(counter(&faulty, "replayed_responses") > 0, "{faulty}");
}

/// `--workload append`: the `checker` column is the append checker's verdict (values
/// observed alone), `version_checker` the version checker's; fixed FORD passes both, a
/// planted FORD bug fails the run through the append checker.
#[test]
fn append_is_judged_from_values_and_catches_a_planted_bug() {
    let out = dmem(&[
        "bench",
        "--workload",
        "append",
        "--scale",
        "tiny",
        "--protocol",
        "ford,ford:complicit-abort",
        "--cns",
        "2",
        "--threads",
        "2",
        "--coroutines",
        "8",
        "--duration-ms",
        "1",
        "--json",
    ]);
    assert!(!out.status.success(), "the planted bug fails the run");
    let rows: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|r| r.get("protocol").is_some())
        .collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0]["checker"], "ok", "{}", rows[0]);
    assert_eq!(rows[0]["version_checker"], "ok", "{}", rows[0]);
    assert_eq!(rows[0]["invariants"], "ok", "{}", rows[0]);
    let bug = rows[1]["checker"].as_str().unwrap();
    assert!(bug.contains("anomalies, first:"), "{bug}");
    let bad = dmem(&["bench", "--workload", "append", "--mix", "keys=x"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("keys=N"));
}

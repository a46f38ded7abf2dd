//! Bad inputs: every one exits 1 with one stderr line starting `dmem: error:`, no panic,
//! within 10 s, and before any expensive work.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BAD: &[&[&str]] = &[
    // no command, unknown command, unknown flag
    &[],
    &["frobnicate"],
    &["perf", "--frobnicate"],
    // perf: sizes that would not fit, overflow, or look hung
    &["perf", "--mn-memory-mib", "18446744073709551615"],
    &["perf", "--mn-memory-mib", "100000000"],
    &["perf", "--clients", "100000"],
    &["perf", "--clients", "0"],
    &["perf", "--clients", "-1"],
    &["perf", "--cns", "100000"],
    &["perf", "--cns", "0"],
    &["perf", "--mns", "65"],
    &["perf", "--batch", "0"],
    &["perf", "--batch", "1,1"],
    &["perf", "--batch", "2000"],
    &["perf", "--op", "read,read"],
    &["perf", "--op", "nop"],
    &["perf", "--fabric", "infiniband"],
    &["perf", "--size", "0"],
    &["perf", "--duration-ms", "0"],
    &["perf", "--op", "cas", "--size", "64"],
    &["perf", "--profile", "cx9"],
    &["perf", "--profile", "no/such/profile.toml"],
    &["perf", "--profile", "Cargo.toml"],
    &["perf", "--csv", "/no/such/dir/out.csv"],
    // bench (transactions)
    &["bench", "--workload", "tpcc", "--scale", "lotus"],
    &["bench", "--workload", "nosuch"],
    &["bench", "--scale", "huge"],
    &["bench", "--protocol", "ford,ford"],
    &["bench", "--protocol", "nosuch"],
    &["bench", "--protocol", ""],
    &["bench", "--mns", "65"],
    &["bench", "--mns", "0"],
    &["bench", "--cns", "-1"],
    &["bench", "--coroutines", "1024", "--threads", "1024"],
    &["bench", "--fabric", "rdma"],
    &["bench", "--profile", "missing.toml"],
    &["bench", "--duration-ms", "abc"],
    &["bench", "--attempts", "0"],
    &["bench", "--backoff", "exp:10"],
    &["bench", "--backoff", "exp:200:10"],
    &["bench", "--backoff", "linear"],
    // message faults: out of range, a protocol that does not claim to tolerate them, a
    // real fabric (its network loses what it loses)
    &["bench", "--protocol", "dnl-4", "--msg-loss", "1.5"],
    &["bench", "--protocol", "dnl-4", "--msg-dup", "-0.1"],
    &["bench", "--protocol", "ford", "--msg-loss", "0.01"],
    &["bench", "--protocol", "lotus", "--msg-dup", "0.01"],
    &[
        "bench",
        "--fabric",
        "tcp",
        "--protocol",
        "dnl-4",
        "--msg-delay",
        "0.1",
    ],
    &[
        "bench",
        "--fabric",
        "shm",
        "--protocol",
        "ford",
        "--msg-loss",
        "0.1",
    ],
    // a run whose insert room (sized by its length) cannot fit in memory
    &[
        "bench",
        "--workload",
        "tpcc",
        "--scale",
        "ford",
        "--mix",
        "oocc",
        "--protocol",
        "oocc",
        "--duration-ms",
        "60000",
    ],
    // bench locks
    &["bench", "locks", "--locks", "18446744073709551615"],
    &["bench", "locks", "--locks", "0"],
    &["bench", "locks", "--cns", "1024", "--clients", "1024"],
    &["bench", "locks", "--lock", "caslock,caslock"],
    &["bench", "locks", "--lock", "mutex"],
    &["bench", "locks", "--zipf", "-1"],
    &["bench", "locks", "--read-ratio", "2"],
    &["bench", "locks", "--profile", "nope"],
    // bench hashtable: sizes priced before anything is built
    &["bench", "hashtable", "--keys", "18446744073709551615"],
    &["bench", "hashtable", "--keys", "100000000000"],
    &["bench", "hashtable", "--keys", "0"],
    &["bench", "hashtable", "--keys", "10k,10k"],
    &["bench", "hashtable", "--table", "btree"],
    &["bench", "hashtable", "--threads", "2000"],
    &["bench", "hashtable", "--batch", "0"],
    &["bench", "hashtable", "--secs", "0"],
    &["bench", "hashtable", "--csv", "/nonexistent-dir/rows.csv"],
    &["bench", "hashtable", "--hasher", "siphash"],
    &["bench", "hashtable", "--hasher", "mix64,mix64"],
    &["bench", "hashtable", "--hasher", ""],
    &["bench", "hashtable", "--put-pct", "101"],
    &["bench", "hashtable", "--put-pct", "-1"],
    // litmus
    &["litmus", "--protocol", "pandora", "--threads", "100000"],
    &["litmus", "--protocol", "pandora", "--threads", "0"],
    &["litmus", "--protocol", "ford", "--bug", ""],
    &["litmus", "--protocol", "ford", "--bug", "nosuch"],
    &["litmus", "--protocol", "pandora", "--bug", "covert-locks"],
    &["litmus", "--protocol", "pandora", "--seeds", "0"],
    &["litmus", "--protocol", "pandora", "--crash-prob", "2"],
    &["litmus", "--protocol", "pandora", "--targeted", "1.5"],
    &["litmus", "--protocol", "pandora", "--steer", "1.5"],
    &["litmus", "--protocol", "pandora", "--msg-loss", "2"],
    &["litmus", "--protocol", "pandora", "--litmus", "9"],
    &["litmus", "--protocol", "pandora", "--litmus", "1,1"],
    &["litmus"],
    // recover
    &[
        "recover",
        "--protocol",
        "lotus",
        "--cns",
        "3",
        "--crash-cns",
        "3",
    ],
    &["recover", "--crash-cns", "0"],
    &["recover", "--crash", "rack"],
    &["recover", "--cns", "1"],
    &["recover", "--crash", "half", "--cns", "3"],
    &["recover", "--heartbeat-us", "0"],
    &[
        "recover",
        "--detect-timeout-us",
        "100",
        "--heartbeat-us",
        "500",
    ],
    &["recover", "--workload", "tpcc", "--scale", "lotus"],
    &["recover", "--protocol", "ford:covert-locks"],
    &["recover", "--profile", "gone.toml"],
    // --config
    &["perf", "--config", "no/such/run.toml"],
    &["perf", "--config"],
    // reproduce
    &["reproduce", "nosuch-paper"],
];

#[test]
fn bad_inputs_exit_1_with_one_error_line() {
    assert!(BAD.len() >= 40);
    let mut failures = Vec::new();
    for args in BAD {
        let started = Instant::now();
        let mut child = Command::new(env!("CARGO_BIN_EXE_dmem"))
            .args(*args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the dmem binary runs");
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            if started.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                let _ = child.wait();
                failures.push(format!("{args:?}: still running after 10 s"));
                break child.wait().expect("wait");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let out = child.wait_with_output().expect("output");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().collect();
        if status.code() != Some(1) {
            failures.push(format!(
                "{args:?}: exit {:?}, stderr {stderr}",
                status.code()
            ));
        } else if lines.len() != 1 || !lines[0].starts_with("dmem: error: ") {
            failures.push(format!("{args:?}: stderr is not one error line: {stderr}"));
        } else if stderr.contains("panicked") || stderr.contains("internal error") {
            failures.push(format!("{args:?}: panicked: {stderr}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_run_too_long_for_its_insert_room_names_the_duration() {
    // 64 coordinators x 66 s of attempts at one per 1.4 µs round trip, 6.75 ORDER_LINE
    // inserts each: far beyond any machine's memory, refused before loading.
    let out = Command::new(env!("CARGO_BIN_EXE_dmem"))
        .args([
            "bench",
            "--workload",
            "tpcc",
            "--scale",
            "ford",
            "--mix",
            "oocc",
            "--profile",
            "cx6",
            "--protocol",
            "oocc:lease=80",
            "--duration-ms",
            "60000",
        ])
        .output()
        .expect("the dmem binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("for 60000 ms") && stderr.contains("--duration-ms"),
        "{stderr}"
    );
    // The budget is spelled out: a refusal that only named the available memory read as
    // if the run fitted whenever the estimate was between three quarters and all of it.
    assert!(
        stderr.contains("dmem uses at most three quarters"),
        "{stderr}"
    );
}

#[test]
fn help_and_version_exit_0() {
    for args in [
        &["--help"][..],
        &["--version"],
        &["bench", "locks", "--help"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_dmem"))
            .args(args)
            .output()
            .expect("runs");
        assert_eq!(out.status.code(), Some(0), "{args:?}");
    }
}

#[test]
fn possible_values_are_in_help() {
    let out = Command::new(env!("CARGO_BIN_EXE_dmem"))
        .args(["bench", "--help"])
        .output()
        .expect("runs");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("smallbank") && help.contains("tpcc"),
        "{help}"
    );
    assert!(help.contains("lotus"), "{help}");
}

#[test]
fn a_closed_stdout_ends_quietly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dmem"))
        .args([
            "bench",
            "locks",
            "--json",
            "--duration-ms",
            "1",
            "--locks",
            "1000",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    // Read one line, then close the pipe as `head -1` does.
    let mut stdout = child.stdout.take().expect("piped");
    let mut first = [0u8; 1];
    use std::io::Read as _;
    stdout.read_exact(&mut first).expect("some output");
    drop(stdout);
    let out = child.wait_with_output().expect("waits");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.is_empty(), "{stderr}");
    assert_ne!(out.status.code(), Some(101), "a panic");
}

#[test]
fn an_absurd_profile_is_refused_before_a_run() {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples/profiles/cx3-fdr.toml"),
    )
    .expect("sample profile");
    let path = std::env::temp_dir().join(format!("dmem-absurd-{}.toml", std::process::id()));
    std::fs::write(
        &path,
        text.replace("link_gbps = 56.0", "link_gbps = 1e-300"),
    )
    .expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_dmem"))
        .args(["perf", "--profile", path.to_str().expect("utf-8")])
        .output()
        .expect("runs");
    let _ = std::fs::remove_file(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("dmem: error: ") && stderr.contains("link_gbps"),
        "{stderr}"
    );
}

#[test]
fn litmus_violations_exit_3() {
    let out = Command::new(env!("CARGO_BIN_EXE_dmem"))
        .args([
            "litmus",
            "--protocol",
            "ford",
            "--bug",
            "covert-locks",
            "--litmus",
            "2",
            "--seeds",
            "20",
            "--json",
        ])
        .output()
        .expect("runs");
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last: serde_json::Value =
        serde_json::from_str(stdout.lines().last().expect("a summary")).expect("JSON lines");
    assert!(
        last["violations"].as_u64().expect("violations") > 0,
        "{last}"
    );
}

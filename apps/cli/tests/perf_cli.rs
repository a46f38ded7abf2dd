//! `dmem perf` end to end: the binary, its JSON, and its error lines.

use std::process::Command;

#[path = "support/netns.rs"]
mod netns;
#[path = "support/run.rs"]
mod run;

use run::{dmem, json_rows};

#[test]
fn sim_json_rows_show_the_cx3_write_and_cas_ceilings() {
    let out = dmem(&[
        "perf",
        "--fabric",
        "sim",
        "--profile",
        "cx3",
        "--op",
        "write,cas",
        "--batch",
        "4",
        "--duration-ms",
        "1",
        "--json",
    ]);
    let rows = json_rows(&out);
    assert_eq!(rows.len(), 2);
    for row in &rows {
        for field in ["mops", "p50_ns", "p99_ns"] {
            assert!(row[field].is_number(), "{field} missing in {row}");
        }
    }
    let write = rows[0]["mops"].as_f64().unwrap();
    let cas = rows[1]["mops"].as_f64().unwrap();
    assert!(write / cas > 10.0, "write {write} Mops vs cas {cas} Mops");
}

#[test]
fn sim_runs_are_reproducible() {
    let args = [
        "perf",
        "--op",
        "read",
        "--batch",
        "2",
        "--duration-ms",
        "1",
        "--seed",
        "5",
        "--json",
    ];
    // Every simulated figure repeats; how fast the simulator ran in real time does not.
    let deterministic = |out: Vec<u8>| -> Vec<serde_json::Value> {
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| {
                let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
                if let Some(o) = v.as_object_mut() {
                    o.remove("sim_real_s");
                    o.remove("sim_verbs_per_real_s");
                }
                v
            })
            .collect()
    };
    let first = deterministic(dmem(&args).stdout);
    assert!(!first.is_empty());
    assert_eq!(first, deterministic(dmem(&args).stdout));
}

#[test]
fn shm_runs_real_verbs() {
    let out = dmem(&[
        "perf",
        "--fabric",
        "shm",
        "--op",
        "faa",
        "--cns",
        "1",
        "--threads",
        "1",
        "--clients",
        "2",
        "--duration-ms",
        "200",
        "--json",
    ]);
    let rows = json_rows(&out);
    assert_eq!(rows[0]["fabric"], "shm");
    assert!(rows[0]["mops"].as_f64().unwrap() > 0.0);
    assert!(rows[0]["cn_cpu_ns_per_wr"].as_f64().unwrap() > 0.0);
}

/// A `dmem perf --serve` child, killed on drop.
struct Served(std::process::Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `dmem perf --fabric tcp --serve ADDR` (one MN of 4 MiB) through `prefix` (e.g.
/// `ip netns exec NS`, or nothing) and returns it with the address it serves on, read from
/// its line.
fn serve_one(prefix: &[&str], addr: &str) -> (Served, String) {
    use std::io::BufRead as _;
    let dmem = env!("CARGO_BIN_EXE_dmem");
    let mut argv: Vec<&str> = prefix.to_vec();
    argv.extend([
        dmem,
        "perf",
        "--fabric",
        "tcp",
        "--mns",
        "1",
        "--mn-memory-mib",
        "4",
        "--serve",
        addr,
    ]);
    let mut child = Command::new(argv[0])
        .args(&argv[1..])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("dmem perf --serve starts");
    let stdout = child.stdout.take().unwrap();
    let served = Served(child);
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .unwrap();
    assert!(
        line.starts_with("dmem perf: MN 0 serves 4 MiB on "),
        "{line}"
    );
    let at = line.trim().rsplit(' ').next().unwrap().to_string();
    (served, at)
}

/// READ and CAS at batch 1 and 16 from `prefix` against the MN at `at`: every row has
/// throughput, latency and the CN-side CPU per work request.
fn perf_against(prefix: &[&str], at: &str) {
    let dmem = env!("CARGO_BIN_EXE_dmem");
    let mut argv: Vec<&str> = prefix.to_vec();
    argv.extend([
        dmem,
        "perf",
        "--fabric",
        "tcp",
        "--servers",
        at,
        "--mns",
        "1",
        "--op",
        "read,cas",
        "--batch",
        "1,16",
        "--cns",
        "1",
        "--threads",
        "1",
        "--clients",
        "1",
        "--duration-ms",
        "300",
        "--json",
    ]);
    let out = Command::new(argv[0]).args(&argv[1..]).output().unwrap();
    let rows = json_rows(&out);
    assert_eq!(rows.len(), 4, "{rows:?}");
    for row in &rows {
        assert_eq!(row["fabric"], "tcp");
        assert!(row["mops"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["p50_ns"].as_u64().unwrap() > 0, "{row}");
        assert!(row["cn_cpu_ns_per_wr"].as_f64().unwrap() > 0.0, "{row}");
    }
}

#[test]
fn tcp_against_a_served_memory_node_in_another_process() {
    let (_served, at) = serve_one(&[], "127.0.0.1:0");
    perf_against(&[], &at);
}

#[test]
fn bad_arguments_get_one_readable_line_and_a_failure_exit() {
    for (args, expected) in [
        (vec!["perf", "--clients", "0"], "0 is not in 1..=65536"),
        (vec!["perf", "--profile", "cx9"], "unknown --profile `cx9`"),
        (vec!["perf", "--op", "cas", "--size", "16"], "use --size 8"),
        (
            vec!["perf", "--size", "1000000", "--clients", "1024"],
            "need",
        ),
        (
            vec!["perf", "--servers", "127.0.0.1:7000"],
            "--servers is for the tcp fabric",
        ),
        (
            vec![
                "perf",
                "--fabric",
                "tcp",
                "--servers",
                "127.0.0.1:7000,127.0.0.1:7001",
            ],
            "--servers names 2 memory nodes but --mns is 1",
        ),
    ] {
        let out = dmem(&args);
        assert!(!out.status.success(), "{args:?} should fail");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with("dmem: error: "), "{stderr}");
        assert!(stderr.contains(expected), "{stderr}");
    }
}

/// `--fabric rdma`: one `dmem: error:` line and exit 1, whether the binary was built without
/// the `rdma` feature (it says how to build it) or with it on a host without an RDMA device
/// (CI and the development machines: no RNIC, no kernel RDMA).
#[test]
fn rdma_without_a_device_or_without_the_feature_is_one_error_line() {
    let has_device =
        std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some());
    if cfg!(feature = "rdma") && has_device {
        eprintln!("skipped: this host has an RDMA device (/sys/class/infiniband)");
        return;
    }
    let out = dmem(&[
        "perf",
        "--fabric",
        "rdma",
        "--op",
        "read",
        "--duration-ms",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    let expected = if cfg!(feature = "rdma") {
        "dmem: error: no RDMA device found ("
    } else {
        "dmem: error: this dmem was built without RDMA support: build it with `cargo build --release -p dmem-cli --features rdma`"
    };
    assert!(lines[0].starts_with(expected), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing on stdout");
}

/// The cross-host figure as a test: the MN (`dmem perf --serve`) in one network
/// namespace, perf's CN in another, joined by veth links to a bridge made here; skipped with
/// a printed reason where namespaces cannot be made.
#[test]
fn tcp_across_network_namespaces() {
    let ns = match netns::Namespaces::three_hosts("dmemp") {
        Ok(ns) => ns,
        Err(why) => {
            netns::unavailable(&why);
            return;
        }
    };
    let (h0, h1) = (ns.host(0), ns.host(1));
    let (_served, at) = serve_one(&["ip", "netns", "exec", &h0], "10.77.0.1:7600");
    assert_eq!(at, "10.77.0.1:7600");
    perf_against(&["ip", "netns", "exec", &h1], &at);
}

//! One output schema on every fabric (issue #35, item 5): `dmem bench --json` on the
//! simulator, on tcp and on shm (MN and CN processes), and `dmem cluster --json`, all read
//! by one reader ([`Line`]); their `--csv` files have one header.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

#[path = "support/run.rs"]
#[allow(dead_code)] // its `json_rows` reads rows as untyped values; here one reader does
mod run;

use run::dmem;

/// One line of `dmem bench --json` or `dmem cluster --json` on any fabric.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Line {
    Summary(Summary),
    Node(NodeRow),
    Protocol(Box<ProtocolRow>),
}

/// The summary object that ends the output.
#[derive(Debug, Deserialize)]
struct Summary {
    summary: bool,
    command: String,
    config: Config,
    rows: usize,
    check_failed: Vec<String>,
}

/// The configuration every summary carries.
#[derive(Debug, Deserialize)]
struct Config {
    workload: String,
    scale: String,
    protocol: Vec<String>,
    fabric: String,
    cns: u64,
    threads: u64,
    coroutines: u64,
    duration_ms: u64,
}

/// A protocol's row: the figures every fabric prints, `None` where a fabric does not
/// measure one (the key is there, its value `null`: [`assert_keys`]).
#[derive(Debug, Deserialize)]
#[allow(dead_code)] // read for the shape: a missing or mistyped field fails the parse
struct ProtocolRow {
    protocol: String,
    workload: String,
    scale: String,
    profile: Option<String>,
    seed: Option<u64>,
    duration_ms: u64,
    backoff: String,
    mtps: f64,
    abort_rate: f64,
    p50_us: f64,
    p99_us: f64,
    mn_reads_per_txn: Option<f64>,
    mn_writes_per_txn: Option<f64>,
    mn_cas_per_txn: Option<f64>,
    mn_faa_per_txn: Option<f64>,
    mn_nic_busy: Option<f64>,
    committed: u64,
    rolled_back: u64,
    failed: u64,
    checker: String,
    checked_txns: u64,
    invariants: String,
    rtts_per_txn: Option<BTreeMap<String, f64>>,
    ro_one_rtt_share: Option<f64>,
    cn_cpu_busy: Option<f64>,
    msgs_per_txn: Option<f64>,
    msgs_per_packet: Option<f64>,
    packet_bytes: Option<f64>,
    #[serde(default)]
    counters: BTreeMap<String, u64>,
    #[serde(default)]
    aborts_by_reason: BTreeMap<String, u64>,
    committed_per_type: BTreeMap<String, u64>,
}

/// A node's row (processes: one per CN and MN that reported).
#[derive(Debug, Deserialize)]
struct NodeRow {
    node: String,
    protocol: String,
    role: String,
    exit: String,
    mtps: Option<f64>,
    p50_us: Option<f64>,
    p99_us: Option<f64>,
    committed: Option<u64>,
}

/// Every key of a protocol row, on every fabric (maps that are empty may be left out:
/// `counters`, `aborts_by_reason`; `version_checker` is only for `--workload append`).
const PROTOCOL_KEYS: &[&str] = &[
    "protocol",
    "workload",
    "scale",
    "profile",
    "seed",
    "duration_ms",
    "backoff",
    "mtps",
    "abort_rate",
    "p50_us",
    "p99_us",
    "mn_reads_per_txn",
    "mn_writes_per_txn",
    "mn_cas_per_txn",
    "mn_faa_per_txn",
    "mn_nic_busy",
    "committed",
    "rolled_back",
    "failed",
    "checker",
    "checked_txns",
    "invariants",
    "rtts_per_txn",
    "ro_one_rtt_share",
    "cn_cpu_busy",
    "msgs_per_txn",
    "msgs_per_packet",
    "packet_bytes",
    "committed_per_type",
];

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("dmem-schema-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What one run printed, read by the one reader.
struct Output {
    protocols: Vec<ProtocolRow>,
    nodes: Vec<NodeRow>,
    summary: Summary,
}

/// Runs `dmem ARGS --json`, expects success, and reads every line with [`Line`] (and
/// checks each protocol row's keys with [`assert_keys`]).
fn read(args: &[&str]) -> Output {
    let mut argv = args.to_vec();
    argv.push("--json");
    let out = dmem(&argv);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{argv:?}: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (mut protocols, mut nodes, mut summary) = (Vec::new(), Vec::new(), None);
    let mut lines = 0;
    for line in stdout.lines() {
        lines += 1;
        let parsed: Line = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("{argv:?}: a line the reader cannot read ({e}): {line}"));
        match parsed {
            Line::Protocol(row) => {
                assert_keys(line);
                protocols.push(*row);
            }
            Line::Node(row) => nodes.push(row),
            Line::Summary(s) => {
                assert!(summary.is_none(), "{argv:?}: two summaries\n{stdout}");
                summary = Some(s);
            }
        }
    }
    let summary = summary.unwrap_or_else(|| panic!("{argv:?}: no summary\n{stdout}"));
    assert!(summary.summary);
    assert_eq!(summary.rows, lines - 1, "{argv:?}: rows counted\n{stdout}");
    assert!(summary.check_failed.is_empty(), "{stdout}");
    Output {
        protocols,
        nodes,
        summary,
    }
}

/// Every key of [`PROTOCOL_KEYS`] is in the row (a figure the fabric does not measure is
/// `null`, not left out).
fn assert_keys(line: &str) {
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    for key in PROTOCOL_KEYS {
        assert!(v.get(*key).is_some(), "no `{key}` in {line}");
    }
}

/// The protocol rows name `protocols` in order, committed something at a positive rate and
/// passed the checker and the invariants.
fn assert_protocols_ok(out: &Output, fabric: &str, protocols: &[&str]) {
    let names: Vec<&str> = out.protocols.iter().map(|r| r.protocol.as_str()).collect();
    assert_eq!(names, protocols, "{fabric}");
    for r in &out.protocols {
        assert!(r.mtps > 0.0, "{fabric}: {r:?}");
        assert!(r.committed > 0, "{fabric}: {r:?}");
        assert!(r.p50_us > 0.0 && r.p99_us >= r.p50_us, "{fabric}: {r:?}");
        assert!((0.0..=1.0).contains(&r.abort_rate), "{fabric}: {r:?}");
        assert_eq!(r.checker, "ok", "{fabric}: {r:?}");
        assert_eq!(r.invariants, "ok", "{fabric}: {r:?}");
        assert_eq!(r.workload, "smallbank", "{fabric}: {r:?}");
        assert_eq!(r.scale, "tiny", "{fabric}: {r:?}");
        assert!(r.checked_txns > 0, "{fabric}: {r:?}");
        assert_eq!(
            r.committed_per_type.values().sum::<u64>(),
            r.committed,
            "{fabric}: {r:?}"
        );
    }
}

/// The summary's configuration is the command's.
fn assert_config(out: &Output, command: &str, fabric: &str, protocols: &[&str], duration: u64) {
    let c = &out.summary.config;
    assert_eq!(out.summary.command, command);
    assert_eq!(c.fabric, fabric);
    assert_eq!(c.workload, "smallbank");
    assert_eq!(c.scale, "tiny");
    assert_eq!(c.protocol, protocols);
    assert_eq!(c.duration_ms, duration);
}

/// The CSV file's header and its protocol rows' `mtps` cells.
fn csv_of(path: &Path) -> (Vec<String>, Vec<f64>) {
    let mut r = csv::Reader::from_path(path).unwrap();
    let header: Vec<String> = r.headers().unwrap().iter().map(str::to_owned).collect();
    let (mtps, node) = (
        header.iter().position(|c| c == "mtps").unwrap(),
        header.iter().position(|c| c == "node").unwrap(),
    );
    let rates = r
        .records()
        .map(Result::unwrap)
        .filter(|rec| rec[node].is_empty())
        .map(|rec| rec[mtps].parse::<f64>().unwrap())
        .collect();
    (header, rates)
}

/// `dmem bench` of tiny SmallBank on ford and pandora on `fabric` (2 MNs, 2 CNs × 1 thread
/// × 3 coroutines), JSON on stdout and CSV to `csv`.
fn bench(fabric: &str, csv: &Path) -> Output {
    read(&[
        "bench",
        "--fabric",
        fabric,
        "--workload",
        "smallbank",
        "--scale",
        "tiny",
        "--protocol",
        "ford,pandora",
        "--mns",
        "2",
        "--cns",
        "2",
        "--threads",
        "1",
        "--coroutines",
        "3",
        "--duration-ms",
        if fabric == "sim" { "2" } else { "500" },
        "--csv",
        csv.to_str().unwrap(),
    ])
}

#[test]
fn bench_prints_one_schema_on_sim_tcp_and_shm() {
    let dir = TempDir::new("bench");
    let protocols = ["ford", "pandora"];
    let mut headers = Vec::new();
    for fabric in ["sim", "tcp", "shm"] {
        let csv = dir.0.join(format!("{fabric}.csv"));
        let out = bench(fabric, &csv);
        assert_protocols_ok(&out, fabric, &protocols);
        let duration = if fabric == "sim" { 2 } else { 500 };
        assert_config(&out, "bench", fabric, &protocols, duration);
        let c = &out.summary.config;
        assert_eq!((c.cns, c.threads, c.coroutines), (2, 1, 3), "{fabric}");
        if fabric == "sim" {
            // The simulator counts what real contexts do not.
            assert!(out.nodes.is_empty());
            for r in &out.protocols {
                assert!(r.mn_reads_per_txn.is_some() && r.rtts_per_txn.is_some());
                assert_eq!(r.profile.as_deref(), Some("cx5"));
            }
        } else {
            for r in &out.protocols {
                assert!(r.mn_reads_per_txn.is_none(), "{fabric}: {r:?}");
                assert!(r.rtts_per_txn.is_none(), "{fabric}: {r:?}");
                assert!(r.profile.is_none(), "{fabric}: {r:?}");
                // Real time: at least 1000 ms.
                assert_eq!(r.duration_ms, 1000, "{fabric}: {r:?}");
            }
            // Per protocol: its 2 CNs and 2 MNs, each a node row.
            for p in protocols {
                let nodes: Vec<&NodeRow> = out.nodes.iter().filter(|n| n.protocol == p).collect();
                let mut names: Vec<&str> = nodes.iter().map(|n| n.node.as_str()).collect();
                names.sort_unstable();
                assert_eq!(names, ["cn0", "cn1", "mn0", "mn1"], "{fabric} {p}");
                for n in nodes {
                    assert_eq!(n.exit, "ok", "{n:?}");
                    if n.role == "cn" {
                        assert!(n.committed > Some(0), "{n:?}");
                        assert!(n.mtps > Some(0.0), "{n:?}");
                        assert!(n.p50_us.is_some() && n.p99_us.is_some(), "{n:?}");
                    } else {
                        assert_eq!(n.role, "mn", "{n:?}");
                        assert!(n.mtps.is_none(), "{n:?}");
                    }
                }
            }
        }
        let (header, rates) = csv_of(&csv);
        assert_eq!(rates.len(), protocols.len(), "{fabric}");
        assert!(rates.iter().all(|&m| m > 0.0), "{fabric}: {rates:?}");
        headers.push((fabric, header));
    }
    for (fabric, header) in &headers {
        assert_eq!(header, &headers[0].1, "{fabric}'s CSV header");
        assert_eq!(header, dmem_cli::bench_txn::CSV_COLUMNS, "{fabric}");
    }
}

/// `dmem cluster --json` of a transaction workload prints the same rows and a summary with
/// the cluster file's configuration.
#[test]
fn cluster_prints_the_bench_schema() {
    let dir = TempDir::new("cluster");
    let text = format!(
        "fabric = \"shm\"\nsocket_dir = \"{}\"\njoin_timeout_ms = 60000\n\n[workload]\nkind = \"smallbank\"\nprotocol = \"ford\"\nscale = \"tiny\"\nduration_ms = 500\nthreads = 1\nclients = 3\n\n[[node]]\nname = \"mn0\"\nrole = \"mn\"\n\n[[node]]\nname = \"cn0\"\nrole = \"cn\"\n\n[[node]]\nname = \"cn1\"\nrole = \"cn\"\n",
        dir.0.join("sockets").display()
    );
    let file = dir.0.join("cluster.toml");
    std::fs::write(&file, text).unwrap();
    let csv = dir.0.join("cluster.csv");
    let out = read(&[
        "cluster",
        "--cluster",
        file.to_str().unwrap(),
        "--csv",
        csv.to_str().unwrap(),
    ]);
    assert_protocols_ok(&out, "cluster", &["ford"]);
    assert_config(&out, "cluster", "shm", &["ford"], 500);
    let c = &out.summary.config;
    assert_eq!((c.cns, c.threads, c.coroutines), (2, 1, 3));
    let mut names: Vec<&str> = out.nodes.iter().map(|n| n.node.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["cn0", "cn1", "mn0"]);
    let (header, rates) = csv_of(&csv);
    assert_eq!(header, dmem_cli::bench_txn::CSV_COLUMNS);
    assert_eq!(rates.len(), 1);
}

/// A symmetric protocol on shm runs its servers in this process: the same protocol row,
/// then this process's node row (CPU time, messages, load).
#[test]
fn servers_in_one_process_print_the_same_schema() {
    let dir = TempDir::new("servers");
    let csv = dir.0.join("servers.csv");
    let out = read(&[
        "bench",
        "--fabric",
        "shm",
        "--workload",
        "smallbank",
        "--scale",
        "tiny",
        "--protocol",
        "dnl-4",
        "--servers",
        "2",
        "--threads",
        "1",
        "--coroutines",
        "2",
        "--duration-ms",
        "1000",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    assert_protocols_ok(&out, "shm", &["dnl-4"]);
    assert_config(&out, "bench", "shm", &["dnl-4"], 1000);
    assert_eq!(out.nodes.len(), 1);
    assert_eq!(out.nodes[0].node, "process");
    assert_eq!(out.nodes[0].role, "servers");
    let (header, rates) = csv_of(&csv);
    assert_eq!(header, dmem_cli::bench_txn::CSV_COLUMNS);
    assert_eq!(rates.len(), 1);
}

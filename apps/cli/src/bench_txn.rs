//! `dmem bench --workload W --protocol P,...`: transaction protocols side by side.
//!
//! For each protocol the same workload (same scale, same seeds, same cluster) runs on its own
//! simulated cluster: the data set is loaded out of band, every coordinator runs a closed loop
//! of the workload's transactions (protocol aborts are retried with the same parameters, as
//! the benchmarks do), and after the run the whole recorded history goes through the
//! serializability checker and the final state through the workload's consistency checks.

use std::collections::BTreeMap;

use anyhow::{Context as _, ensure};
use clap::{Args as ClapArgs, ValueEnum};
use dmem_deploy::{ClusterShape, DeploySpec, Registry};
use dmem_harness::{Backoff, BenchConfig, MAX_ATTEMPTS, deploy_spec, run_bench, run_spec};
use dmem_sim::{MessageFaults, NicProfile};
use dmem_workloads::{AnyWorkload, Scale, Workload};
use serde::Serialize;

use crate::common::{self, CheckFailed, Sink, round};

/// A workload by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadArg {
    /// Key-value store: one-key reads and writes.
    Kvs,
    /// YCSB A-style mixes.
    Ycsb,
    /// SmallBank: six banking transactions over accounts.
    Smallbank,
    /// TATP: telecom subscriber transactions, read-mostly.
    Tatp,
    /// TPC-C: warehouses, orders, stock.
    Tpcc,
    /// List append (Elle's): judged from the values observed alone.
    Append,
}

impl WorkloadArg {
    /// Its name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            WorkloadArg::Kvs => "kvs",
            WorkloadArg::Ycsb => "ycsb",
            WorkloadArg::Smallbank => "smallbank",
            WorkloadArg::Tatp => "tatp",
            WorkloadArg::Tpcc => "tpcc",
            WorkloadArg::Append => "append",
        }
    }
}

/// A workload's size preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ScaleArg {
    /// Tiny tables for smoke runs.
    Tiny,
    /// A laptop-sized data set (the default).
    Small,
    /// FORD's evaluation sizes.
    Ford,
    /// Motor's evaluation sizes.
    Motor,
    /// LOTUS's evaluation sizes.
    Lotus,
}

impl ScaleArg {
    /// Its name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            ScaleArg::Tiny => "tiny",
            ScaleArg::Small => "small",
            ScaleArg::Ford => "ford",
            ScaleArg::Motor => "motor",
            ScaleArg::Lotus => "lotus",
        }
    }
}

/// Fabrics of the transaction commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TxnFabric {
    /// The deterministic simulated cluster (every protocol).
    Sim,
    /// Separate MN and CN processes on this host over the tcp fabric (real time; `dmem
    /// cluster` with a generated cluster file), or for a symmetric protocol `--servers`
    /// server processes (`dmem server`).
    Tcp,
    /// Separate MN and CN processes on this host over the shm fabric: the CNs map each
    /// MN's memfd (real time; `dmem cluster` with a generated cluster file).
    Shm,
    /// Separate MN and CN processes on this host over an RDMA NIC (a dmem built with
    /// `--features rdma`): one-sided verbs through queue pairs, the control plane over
    /// loopback TCP (real time; `dmem cluster` with a generated cluster file).
    Rdma,
}

impl TxnFabric {
    /// Its name on the command line.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            TxnFabric::Sim => "sim",
            TxnFabric::Tcp => "tcp",
            TxnFabric::Shm => "shm",
            TxnFabric::Rdma => "rdma",
        }
    }
}

/// Bytes of memory a run of `protocol` on `workload` takes (MN regions plus loading), `None` past 2^64.
///
/// # Errors
/// An unknown protocol or a store that cannot be laid out.
pub fn memory_estimate(
    registry: &Registry,
    protocol: &str,
    workload: &AnyWorkload,
    coordinators: u16,
    mns: u16,
) -> anyhow::Result<Option<u64>> {
    memory_estimate_for(
        registry,
        protocol,
        workload,
        &deploy_spec(workload, coordinators),
        mns,
    )
}

/// [`memory_estimate`] for the store `spec` asks for (a run's, with its insert room:
/// `dmem_harness::run_spec`).
///
/// # Errors
/// An unknown protocol or a store that cannot be laid out (a run whose insert room
/// overflows).
pub fn memory_estimate_for(
    registry: &Registry,
    protocol: &str,
    workload: &AnyWorkload,
    spec: &DeploySpec,
    mns: u16,
) -> anyhow::Result<Option<u64>> {
    let p = registry.get(protocol)?;
    let per_mn = p
        .mn_bytes_per_mn(spec, mns)
        .with_context(|| format!("sizing {protocol}'s store"))?;
    // The simulator holds each MN's region once (counted x1: it was x1.5, then x1.25, and
    // no peak measured since came near the regions alone — 8.74 GB for SmallBank's 8.9 GB
    // of regions at --scale lotus under FORD, 10.94 GB for TATP's 11.3 GB at --scale motor,
    // 11.14 GB for LOTUS's 12.27 GB at TPC-C small with 2 versions, CN side included:
    // pages a run does not touch, such as the rest of a pooled table's insert shares, are
    // zero pages) and the CN side holds per-record state for hashed tables (the loader's
    // slot map, load buffers): an upper
    // bound of 8 KiB per record covers the peak RSS measured at --scale small before tables
    // were direct-mapped (TATP: 8.2 GB for 975k records and 1.2 GB of regions; TPC-C:
    // 19.8 GB for 4.4M records and 14 GB). A direct-mapped table (dense keys, see
    // `dmem-store`) keeps one bit per key on the CN side (a pooled one four bytes per key of
    // its space, 17 bytes per TATP call forwarding); 64 bytes per record and 256 MiB for
    // one checked history segment bound it (SmallBank at --scale lotus: 40M records). Not
    // counted: the checker's carried frontier, about 130 bytes per record a run writes
    // (`dmem-txn`'s README, "Checking whole runs"), which a run long enough to write most
    // of a large data set adds.
    let records: u64 = workload.tables().iter().map(|t| t.expected_records).sum();
    let (direct, hashed): (Vec<_>, Vec<_>) = workload
        .tables()
        .into_iter()
        .partition(|t| workload.key_space(t.id).is_some());
    let direct: u64 = direct.iter().map(|t| t.expected_records).sum();
    let hashed: u64 = hashed.iter().map(|t| t.expected_records).sum();
    if p.symmetric() {
        // Servers hold every record R times in their own memory: 2 KiB per record bounds
        // the peak RSS measured for dnl-4 on SmallBank at --scale small (90 MB for 200k
        // records, history included).
        return Ok(records.checked_mul(2 << 10));
    }
    Ok(common::product(&[per_mn, u64::from(mns)])
        .and_then(|b| {
            let per_record = p.cn_bytes_per_hashed_record().unwrap_or(8 << 10);
            b.checked_add(hashed.checked_mul(per_record)?)
        })
        .and_then(|b| b.checked_add(direct.checked_mul(64)?))
        .and_then(|b| b.checked_add(256 << 20)))
}

/// Arguments of the transaction benchmark (`dmem bench` without a subcommand).
#[derive(Debug, Clone, ClapArgs, Serialize)]
pub struct Args {
    /// Workload.
    #[arg(long, value_enum, default_value = "smallbank")]
    workload: WorkloadArg,
    /// Size preset of the workload (its memory is estimated and checked before loading).
    #[arg(long, value_enum, default_value = "small")]
    scale: ScaleArg,
    /// YCSB mix (with `--workload ycsb`): read-only, read-intensive (the default),
    /// unknown-read-set (OOCC §VIII-C: two reads, then two keys derived from them), a, b, c, f,
    /// or oG-P for the O(G,P) micro-benchmark (G Gets and P blind Puts per transaction, 16-byte
    /// values, uniform keys; `o4-2` is O(4,2)). With `--workload tpcc`: `oocc`, the OOCC
    /// paper's Table IV mix (New-Order 45, Payment 40, the others 4 each). With
    /// `--workload append`: `keys=N`, the number of lists (contention).
    #[arg(long)]
    mix: Option<String>,
    /// Protocols to run side by side, comma-separated: any registered name — ford, occ
    /// (OOCC's OCC baseline: fixed FORD), oocc, drtm, dslr, motor, motor-si,
    /// pandora, pandora-lock-logging (traditional "log before lock" instead of PILL,
    /// Pandora §6.1), ford:BUG[+BUG] for FORD with bugs of Pandora Table 1 switched on,
    /// or the symmetric dnl-4, dnl-2, dnl-1, fasst, dnl:P[+FLAG] (sized by --servers).
    #[arg(long, value_delimiter = ',', default_value = "ford,pandora")]
    protocol: Vec<String>,
    /// Fabric: the simulated cluster, or `tcp`/`shm`: a local cluster of separate MN and CN
    /// processes on this host, over loopback TCP or shared memfd mappings (ford and
    /// pandora; each CN runs threads x coroutines coordinators on one executor thread;
    /// --duration-ms is real time, at least 1000).
    #[arg(long, value_enum, default_value = "sim")]
    fabric: TxnFabric,
    /// NIC profile of the simulated cluster: cx3, cx4, cx5, cx6 or a TOML file.
    #[arg(long, default_value = "cx5")]
    profile: String,
    /// Memory nodes (replication degree min(3, MNs)).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=64))]
    mns: u16,
    /// Compute nodes (CNs × threads × coroutines must stay below 65535).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=4096))]
    cns: u16,
    /// Servers of a symmetric protocol (dnl-4, dnl-2, dnl-1, fasst: every server is both
    /// coordinator and storage; they replace --mns and --cns for it).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..=4096))]
    servers: u16,
    /// Threads (cores) per CN.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: u16,
    /// Coroutines (coordinators) per thread.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=1024))]
    coroutines: u16,
    /// Measured duration, ms of virtual time (after a 10 % warm-up).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    duration_ms: u64,
    /// Seed of the cluster and of every coordinator's transaction generator.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Skip the history checker (and record no history).
    #[arg(long)]
    no_check: bool,
    /// The checker judges every transaction of the run, in segments of this many ms of
    /// virtual time: at each cut the clients pause until none is in flight, the segment is
    /// checked against what earlier segments carried (each record's latest committed
    /// writer) and dropped, so memory stays flat in run length (0: keep the whole history
    /// and check it once at the end).
    #[arg(long, default_value_t = 50)]
    check_segment_ms: u64,
    /// Tries per transaction: an aborted transaction is retried at once with the same
    /// parameters until it commits or this many tries are made. 1: an aborted transaction
    /// is dropped and the coordinator draws a new one, as OOCC's artifact runs its
    /// benchmarks.
    #[arg(long, default_value_t = MAX_ATTEMPTS, value_parser = clap::value_parser!(u32).range(1..))]
    attempts: u32,
    /// The wait before each retry of an aborted transaction: `none` (at once) or
    /// `exp:BASE_US:CAP_US`, randomized exponential backoff — after the n-th failed try a
    /// uniform draw from [0, min(CAP, BASE × 2^(n−1))] µs, seeded per coordinator (a
    /// simulator run stays deterministic), slept on the coordinator's clock.
    #[arg(long, default_value_t = Backoff::None)]
    #[serde(serialize_with = "as_text")]
    backoff: Backoff,
    /// Start every CN with a cold address cache (the first access to each record then
    /// costs an index-bucket READ first). By default each CN starts warm, as after scanning
    /// the index once at start-up: FORD's own code reads an item with its bucket in one
    /// READ, so only a warm cache compares round trips like for like.
    #[arg(long)]
    cold_cache: bool,
    /// Probability that a two-sided message (LOTUS's lock RPCs, Dandelion's and FaSST's
    /// RPCs) is lost on the simulated network. One-sided verbs are never lost (RC queue
    /// pairs retransmit in the NIC). Only for protocols that claim to tolerate loss
    /// (lotus, dnl-*, fasst); the others are refused.
    #[arg(long, default_value_t = 0.0)]
    msg_loss: f64,
    /// Probability that a two-sided message is delivered twice (dnl-*, fasst: a request
    /// runs once, a repeated reply is ignored; the others are refused).
    #[arg(long, default_value_t = 0.0)]
    msg_dup: f64,
    /// Probability that a two-sided message is delayed by `--msg-delay-ns`.
    #[arg(long, default_value_t = 0.0)]
    msg_delay: f64,
    /// Extra delay of a delayed message, ns.
    #[arg(long, default_value_t = 4_000)]
    msg_delay_ns: u64,
    /// Print JSON lines instead of a table: one object per protocol (the same fields on
    /// every fabric, `null` where a fabric does not measure one), across processes one
    /// per node (`node`: its name), then a summary with the configuration.
    #[arg(long)]
    json: bool,
    /// Also write the rows to this CSV file (the same columns on every fabric).
    #[arg(long, value_name = "FILE")]
    csv: Option<std::path::PathBuf>,
    /// With `--fabric tcp|shm`: run on the nodes this cluster file names (addresses, network
    /// namespaces, heartbeat settings) instead of a local cluster on loopback; the workload,
    /// scale, protocols, duration and coordinators per CN come from these flags, --mns and
    /// --cns from the file.
    #[arg(long, value_name = "FILE")]
    cluster: Option<std::path::PathBuf>,
}

/// The header's note of message faults (empty without any): what share of the
/// simulated network's two-sided messages is lost, duplicated and delayed.
fn describe_faults(f: &MessageFaults) -> String {
    let mut parts = Vec::new();
    if f.loss > 0.0 {
        parts.push(format!("{}% lost", f.loss * 100.0));
    }
    if f.duplicate > 0.0 {
        parts.push(format!("{}% duplicated", f.duplicate * 100.0));
    }
    if f.delay > 0.0 {
        parts.push(format!("{}% delayed {} ns", f.delay * 100.0, f.delay_ns));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("  messages {}", parts.join(", "))
    }
}

/// Serializes `value` as its text (`--backoff`'s syntax).
fn as_text<S: serde::Serializer>(value: &Backoff, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(value)
}

/// What `dmem bench --fabric tcp|shm` needs from the arguments.
#[derive(Debug, Clone)]
pub struct TcpShape {
    /// Workload name.
    pub workload: &'static str,
    /// Scale name.
    pub scale: &'static str,
    /// Protocol names.
    pub protocols: Vec<String>,
    /// Memory nodes.
    pub mns: u16,
    /// Compute nodes.
    pub cns: u16,
    /// Servers of a symmetric protocol (`--servers`; `role = "server"` nodes instead of
    /// MNs and CNs).
    pub servers: u16,
    /// Coordinators per CN (threads x coroutines).
    pub coordinators_per_cn: u32,
    /// Real-time duration, ms.
    pub duration_ms: u64,
    /// Tries per transaction (`--attempts`).
    pub attempts: u32,
    /// The wait before each retry (`--backoff`).
    pub backoff: Backoff,
    /// JSON output.
    pub json: bool,
    /// The CSV file (`--csv`).
    pub csv: Option<std::path::PathBuf>,
    /// A cluster file whose nodes to use.
    pub cluster: Option<std::path::PathBuf>,
}

impl Args {
    /// The fabric asked for.
    #[must_use]
    pub fn fabric(&self) -> TxnFabric {
        self.fabric
    }

    /// The shape of a tcp or shm run (see [`TxnFabric::Tcp`], [`TxnFabric::Shm`]).
    #[must_use]
    pub fn tcp_shape(&self) -> TcpShape {
        TcpShape {
            workload: self.workload.name(),
            scale: self.scale.name(),
            protocols: self.protocol.clone(),
            mns: self.mns,
            cns: self.cns,
            servers: self.servers,
            coordinators_per_cn: u32::from(self.threads) * u32::from(self.coroutines),
            duration_ms: self.duration_ms.max(1000),
            attempts: self.attempts,
            backoff: self.backoff,
            json: self.json,
            csv: self.csv.clone(),
            cluster: self.cluster.clone(),
        }
    }
}

/// One protocol's results: the row every fabric prints (`dmem bench --json` and `--csv`
/// on sim, tcp, shm and rdma, and `dmem cluster --json` of a transaction workload), and the
/// table's columns. A figure a fabric cannot measure is `None` (JSON `null`, an empty CSV
/// cell, `-` in the table), never a made-up number; the README's "Output schema" lists
/// which.
///
/// On the simulator the figures are over the measured window of virtual time (after a
/// 10 % warm-up). Across processes (tcp, shm, rdma) they are over the whole run of every
/// CN's coordinators: see [`Row::across_processes`].
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub protocol: String,
    pub workload: String,
    pub scale: String,
    /// NIC profile of the simulated cluster; `None` on real fabrics.
    pub profile: Option<String>,
    /// Seed of the run; `None` across processes (each coordinator seeds its generator from
    /// its id).
    pub seed: Option<u64>,
    /// Measured duration, ms (virtual on the simulator, real time across processes).
    pub duration_ms: u64,
    /// The wait before each retry (`--backoff`).
    pub backoff: String,
    /// Committed transactions per second, millions (of virtual time on the simulator, of
    /// measured real time across processes).
    pub mtps: f64,
    /// Aborted attempts / all attempts.
    pub abort_rate: f64,
    /// Median latency of a committed transaction (first begin to commit, retries included), µs.
    pub p50_us: f64,
    /// 99th-percentile latency, µs.
    pub p99_us: f64,
    /// MN NIC work requests per committed transaction, by kind (the simulator counts them;
    /// `None` on real fabrics, whose contexts keep no per-verb counters).
    pub mn_reads_per_txn: Option<f64>,
    pub mn_writes_per_txn: Option<f64>,
    pub mn_cas_per_txn: Option<f64>,
    pub mn_faa_per_txn: Option<f64>,
    /// Busiest MN NIC resource's busy fraction (simulator only).
    pub mn_nic_busy: Option<f64>,
    pub committed: u64,
    /// Transactions the workload itself rolled back (not protocol aborts).
    pub rolled_back: u64,
    /// Transactions given up after too many aborts.
    pub failed: u64,
    /// Verdict of the history checker: "ok", "skipped", or the first anomaly. With
    /// `--workload append`, the append checker's (values observed alone).
    pub checker: String,
    /// With `--workload append`: the verdict of the history checker on the versions the
    /// protocol reported, beside the append checker's in `checker`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version_checker: Option<String>,
    /// Transactions in the checked history.
    pub checked_txns: usize,
    /// Verdict of the workload's consistency checks: "ok" or the first violation.
    pub invariants: String,
    /// Mean round trips (post lists awaited) of a committed transaction, per transaction
    /// type and under `all` (simulator only: real contexts count no post lists).
    pub rtts_per_txn: Option<BTreeMap<String, f64>>,
    /// Share of committed read-only transactions that took no round trip beyond their
    /// execution rounds (no validation): for one-round ones, committed in one round trip.
    pub ro_one_rtt_share: Option<f64>,
    /// Share of CN core time spent on charged CPU work (simulator only).
    pub cn_cpu_busy: Option<f64>,
    /// Two-sided messages CNs received per committed transaction (simulator only).
    pub msgs_per_txn: Option<f64>,
    /// Messages per packet, for protocols that batch RPCs (Dandelion).
    pub msgs_per_packet: Option<f64>,
    /// Mean packet payload, bytes, for protocols that batch RPCs.
    pub packet_bytes: Option<f64>,
    /// Deployment counters (LOTUS's resharding hand-overs and their interruption,
    /// Dandelion's RPC re-sends and duplicates); across processes summed over the CNs.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub counters: BTreeMap<String, u64>,
    /// Failed attempts of the measured transactions by reason (the protocol's abort reason).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub aborts_by_reason: BTreeMap<String, u64>,
    /// Committed transactions per type (the committed mix).
    pub committed_per_type: BTreeMap<String, u64>,
}

/// The CSV columns of `dmem bench --csv` (and `dmem cluster --csv`), on every fabric: every
/// field of [`Row`] in order, then the fields of a per-node row (`node`, `role`). A map
/// (`rtts_per_txn`, `counters`, ...) is one cell of compact JSON; a missing or `null` field
/// an empty cell.
pub const CSV_COLUMNS: &[&str] = &[
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
    "version_checker",
    "checked_txns",
    "invariants",
    "rtts_per_txn",
    "ro_one_rtt_share",
    "cn_cpu_busy",
    "msgs_per_txn",
    "msgs_per_packet",
    "packet_bytes",
    "counters",
    "aborts_by_reason",
    "committed_per_type",
    "node",
    "role",
];

/// What the processes of one run measured, summed over its CNs, for
/// [`Row::across_processes`].
#[derive(Debug, Clone, Default)]
pub struct ProcessTally {
    /// Committed transactions, over every CN.
    pub committed: u64,
    pub rolled_back: u64,
    pub failed: u64,
    /// Tries made (each attempt of each transaction), over every CN.
    pub attempts: u64,
    /// The measured window, ns: the longest of the CNs' windows, each from its
    /// coordinators' start to its last coordinator's end on that CN's `CLOCK_MONOTONIC`.
    pub window_ns: u64,
    /// Latency of every committed transaction (first begin to commit, retries included), ns.
    pub latency: Option<hdrhistogram::Histogram<u64>>,
    pub counters: BTreeMap<String, u64>,
    pub aborts_by_reason: BTreeMap<String, u64>,
    pub committed_per_type: BTreeMap<String, u64>,
}

impl Row {
    /// The row of a run across processes (`dmem bench --fabric tcp|shm|rdma`, `dmem
    /// cluster`): `mtps` is the CNs' commits over [`ProcessTally::window_ns`] (real time,
    /// `CLOCK_MONOTONIC`: the longest CN's run of its coordinators, warm-up included —
    /// the CNs start together on the first CN's word), the abort rate over every attempt,
    /// the latencies from the CNs' merged histograms; what real contexts do not count
    /// (verbs, round trips, NIC and CPU busy, messages) is `None`.
    #[must_use]
    #[allow(clippy::too_many_arguments)]
    pub fn across_processes(
        protocol: &str,
        workload: &str,
        scale: &str,
        duration_ms: u64,
        backoff: &str,
        tally: ProcessTally,
        checker: String,
        checked_txns: usize,
        invariants: String,
    ) -> Self {
        let finished = tally.committed + tally.rolled_back;
        let quantile = |q: f64| {
            tally
                .latency
                .as_ref()
                .map_or(0.0, |h| h.value_at_quantile(q) as f64 / 1e3)
        };
        Row {
            protocol: protocol.to_owned(),
            workload: workload.to_owned(),
            scale: scale.to_owned(),
            profile: None,
            seed: None,
            duration_ms,
            backoff: backoff.to_owned(),
            // Six decimals (one transaction per second): a real-time run of a debug build
            // on a loaded host may commit fewer than 100 per second.
            mtps: round(
                tally.committed as f64 / tally.window_ns.max(1) as f64 * 1e3,
                6,
            ),
            abort_rate: round(
                tally.attempts.saturating_sub(finished) as f64 / tally.attempts.max(1) as f64,
                4,
            ),
            p50_us: round(quantile(0.5), 2),
            p99_us: round(quantile(0.99), 2),
            mn_reads_per_txn: None,
            mn_writes_per_txn: None,
            mn_cas_per_txn: None,
            mn_faa_per_txn: None,
            mn_nic_busy: None,
            committed: tally.committed,
            rolled_back: tally.rolled_back,
            failed: tally.failed,
            checker,
            version_checker: None,
            checked_txns,
            invariants,
            rtts_per_txn: None,
            ro_one_rtt_share: None,
            cn_cpu_busy: None,
            msgs_per_txn: None,
            msgs_per_packet: None,
            packet_bytes: None,
            counters: tally.counters,
            aborts_by_reason: tally.aborts_by_reason,
            committed_per_type: tally.committed_per_type,
        }
    }
}

impl Args {
    /// The simulated network's message faults (`--msg-loss`, `--msg-dup`, `--msg-delay`),
    /// checked: probabilities in [0, 1], on the simulated cluster only, and each for
    /// protocols that claim to tolerate it.
    ///
    /// # Errors
    /// A line saying which flag to drop or change.
    pub fn message_faults(&self, registry: &Registry) -> anyhow::Result<MessageFaults> {
        let faults = common::message_faults(
            self.msg_loss,
            self.msg_dup,
            self.msg_delay,
            self.msg_delay_ns,
        )?;
        if faults.loss == 0.0 && faults.duplicate == 0.0 && faults.delay == 0.0 {
            return Ok(MessageFaults::default());
        }
        ensure!(
            self.fabric == TxnFabric::Sim,
            "--msg-loss, --msg-dup and --msg-delay mistreat the simulated network's messages: drop them with --fabric {}",
            self.fabric.name()
        );
        for name in &self.protocol {
            let p = registry.get(name).context("in --protocol")?;
            ensure!(
                faults.loss == 0.0 || p.tolerates_message_loss(),
                "--msg-loss: {name} does not claim to tolerate lost messages (lotus, dnl-*, fasst do): bench it without --msg-loss"
            );
            ensure!(
                faults.duplicate == 0.0 || p.tolerates_message_duplication(),
                "--msg-dup: {name} does not claim to tolerate duplicated messages (dnl-*, fasst do): bench it without --msg-dup"
            );
        }
        Ok(faults)
    }

    /// Checks the flags of a simulated run and returns its workload, scale, NIC profile and
    /// message faults.
    fn validate(
        &self,
        registry: &Registry,
    ) -> anyhow::Result<(AnyWorkload, Scale, NicProfile, MessageFaults)> {
        ensure!(
            self.cluster.is_none(),
            "--cluster FILE runs on the nodes of a cluster file: add --fabric tcp or --fabric shm"
        );
        ensure!(
            !self.protocol.is_empty() && self.protocol.iter().all(|p| !p.is_empty()),
            "--protocol needs at least one protocol name"
        );
        common::no_duplicates("protocol", &self.protocol)?;
        let coordinators = u32::from(self.cns.max(self.servers))
            * u32::from(self.threads)
            * u32::from(self.coroutines);
        ensure!(
            coordinators < u32::from(u16::MAX),
            "{coordinators} coordinators exceed the 16-bit coordinator ids: lower --cns, --threads or --coroutines"
        );
        for p in &self.protocol {
            registry.get(p).context("in --protocol")?;
        }
        let profile = common::load_profile(&self.profile)?;
        let (mut workload, scale) = parse_workload(self.workload.name(), self.scale.name())?;
        if let Some(mix) = &self.mix {
            workload = workload_mix(self.workload.name(), scale, mix)?;
        }
        // The store is sized for this run: a growing table's insert room follows the run's
        // length (`dmem_harness::run_spec`), so a long run may be refused where a short one
        // fits.
        let faults = self.message_faults(registry)?;
        let spec = run_spec(&workload, &self.config(&profile, faults))?;
        for p in &self.protocol {
            let bytes = memory_estimate_for(registry, p, &workload, &spec, self.mns)?;
            common::ensure_memory(
                bytes,
                &format!(
                    "{} at --scale {} on {} MNs under {p} for {} ms",
                    self.workload.name(),
                    self.scale.name(),
                    self.mns,
                    self.duration_ms
                ),
                "--scale (tiny, small), --duration-ms or --mns",
            )?;
        }
        Ok((workload, scale, profile, faults))
    }

    fn config(&self, profile: &NicProfile, message_faults: MessageFaults) -> BenchConfig {
        BenchConfig {
            shape: ClusterShape {
                message_faults,
                mns: self.mns,
                cns: self.cns,
                threads: self.threads,
                seed: self.seed,
                profile: profile.clone(),
                min_mn_bytes: 1 << 20,
            },
            coroutines: self.coroutines,
            duration: self.duration_ms * 1_000_000,
            seed: self.seed,
            check: !self.no_check,
            warm_cache: !self.cold_cache,
            check_segment: (self.check_segment_ms > 0).then(|| self.check_segment_ms * 1_000_000),
            max_attempts: self.attempts,
            backoff: self.backoff,
        }
    }
}

/// The workload and scale named on the command line.
///
/// # Errors
/// An unknown workload or scale.
pub fn parse_workload(workload: &str, scale: &str) -> anyhow::Result<(AnyWorkload, Scale)> {
    let scale = Scale::from_name(scale).with_context(|| {
        format!("unknown --scale `{scale}`: use tiny, small, ford, motor or lotus")
    })?;
    let workload = AnyWorkload::new(workload, scale).map_err(|e| {
        anyhow::anyhow!(
            "unknown --workload `{}`: use kvs, ycsb, smallbank, tatp, tpcc or append",
            e.0
        )
    })?;
    Ok((workload, scale))
}

/// YCSB, TPC-C or list append with the mix named by `--mix`.
fn workload_mix(workload: &str, scale: Scale, mix: &str) -> anyhow::Result<AnyWorkload> {
    use dmem_workloads::kv::{KvConfig, KvWorkload, YcsbMix};
    use dmem_workloads::tpcc::{OOCC_MIX, Tpcc, TpccConfig};
    if workload == "tpcc" {
        ensure!(
            mix == "oocc",
            "unknown --mix `{mix}` for tpcc: use oocc (OOCC's Table IV mix)"
        );
        let config = TpccConfig {
            weights: OOCC_MIX,
            ..TpccConfig::preset(scale)
        };
        return Ok(AnyWorkload::Tpcc(Tpcc::new(config)));
    }
    if workload == "append" {
        use dmem_workloads::append::{AppendConfig, ListAppend};
        let keys = mix
            .strip_prefix("keys=")
            .and_then(|k| k.parse::<u64>().ok())
            .filter(|&k| k >= 4)
            .with_context(|| format!("unknown --mix `{mix}` for append: use keys=N (N ≥ 4)"))?;
        let config = AppendConfig {
            keys,
            ..AppendConfig::preset(scale)
        };
        return Ok(AnyWorkload::Append(ListAppend::new(config)));
    }
    ensure!(
        workload == "ycsb",
        "--mix applies to --workload ycsb, tpcc and append only"
    );
    if let Some((gets, puts)) = mix
        .strip_prefix('o')
        .and_then(|gp| gp.split_once('-'))
        .and_then(|(g, p)| Some((g.parse::<u32>().ok()?, p.parse::<u32>().ok()?)))
    {
        ensure!(
            gets + puts >= 1 && gets + puts <= 64,
            "--mix oG-P needs 1 to 64 keys per transaction"
        );
        return Ok(AnyWorkload::Kv(KvWorkload::new(KvConfig::micro(
            scale, gets, puts,
        ))));
    }
    let mix = match mix {
        "read-only" => YcsbMix::ReadOnly,
        "read-intensive" => YcsbMix::ReadIntensive,
        "unknown-read-set" => YcsbMix::UnknownReadSet,
        "a" => YcsbMix::A,
        "b" => YcsbMix::B,
        "c" => YcsbMix::C,
        "f" => YcsbMix::F,
        other => {
            anyhow::bail!(
                "unknown --mix `{other}`: use read-only, read-intensive, unknown-read-set, a, b, c, f or oG-P (O(G,P): G Gets and P blind Puts)"
            )
        }
    };
    Ok(AnyWorkload::Kv(KvWorkload::new(KvConfig::ycsb(scale, mix))))
}

fn run_protocol(
    args: &Args,
    registry: &Registry,
    workload: &AnyWorkload,
    profile: &NicProfile,
    faults: MessageFaults,
    protocol: &str,
) -> anyhow::Result<Row> {
    let p = registry.get(protocol)?;
    let mut cfg = args.config(profile, faults);
    if p.symmetric() {
        cfg.shape = cfg.shape.symmetric(args.servers);
    }
    let warm_up_end = cfg.duration / 10;
    let progress = common::progress(
        (warm_up_end + cfg.duration) / 1_000,
        protocol,
        "µs virtual",
        args.json,
    );
    let r = run_bench(&*p, workload, &cfg, |now| {
        progress.set_position(now / 1_000)
    })
    .with_context(|| format!("running {protocol}"))?;
    progress.finish_and_clear();
    if r.in_doubt > 0 {
        eprintln!(
            "dmem bench: {protocol}: {} transactions ended in doubt",
            r.in_doubt
        );
    }
    Ok(Row {
        protocol: protocol.to_string(),
        workload: args.workload.name().to_string(),
        scale: args.scale.name().to_string(),
        profile: Some(profile.name.clone()),
        seed: Some(args.seed),
        duration_ms: args.duration_ms,
        backoff: args.backoff.to_string(),
        mtps: round(r.mtps, 4),
        abort_rate: round(r.abort_rate, 4),
        p50_us: round(r.p50_us, 2),
        p99_us: round(r.p99_us, 2),
        mn_reads_per_txn: Some(round(r.mn_per_txn[0], 3)),
        mn_writes_per_txn: Some(round(r.mn_per_txn[1], 3)),
        mn_cas_per_txn: Some(round(r.mn_per_txn[2], 3)),
        mn_faa_per_txn: Some(round(r.mn_per_txn[3], 3)),
        mn_nic_busy: Some(round(r.mn_nic_busy, 3)),
        committed: r.committed,
        rolled_back: r.rolled_back,
        failed: r.failed,
        checker: r
            .append_checker
            .clone()
            .unwrap_or_else(|| r.checker.clone()),
        version_checker: r.append_checker.is_some().then_some(r.checker),
        checked_txns: r.checked_txns,
        invariants: r.invariants,
        rtts_per_txn: Some(
            r.rtts_per_txn
                .into_iter()
                .map(|(k, v)| (k, round(v, 3)))
                .collect(),
        ),
        ro_one_rtt_share: (r.ro_committed > 0)
            .then(|| round(r.ro_no_validation as f64 / r.ro_committed as f64, 4)),
        cn_cpu_busy: Some(round(r.cn_cpu_busy, 3)),
        msgs_per_txn: Some(round(r.msgs_per_txn, 3)),
        msgs_per_packet: r.packets.map(|(m, _)| round(m, 2)),
        packet_bytes: r.packets.map(|(_, b)| round(b, 1)),
        counters: r.counters,
        aborts_by_reason: r.errors,
        committed_per_type: r.committed_per_type,
    })
}

/// Runs `dmem bench ARGV...` (flags only) on `registry`'s protocols without printing; one
/// JSON row per protocol (checks are in the rows, not errors).
///
/// # Errors
/// A bad flag or a run that could not be built.
pub fn measure(argv: &[&str], registry: &Registry) -> anyhow::Result<Vec<serde_json::Value>> {
    use clap::Parser as _;
    #[derive(clap::Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }
    let mut args =
        Cli::try_parse_from(std::iter::once("dmem-bench").chain(argv.iter().copied()))?.args;
    args.json = true; // no progress bar
    let (workload, _, profile, faults) = args.validate(registry)?;
    args.protocol
        .iter()
        .map(|p| {
            Ok(serde_json::to_value(run_protocol(
                &args, registry, &workload, &profile, faults, p,
            )?)?)
        })
        .collect()
}

/// Runs the transaction benchmark on the protocols of `registry`; returns the rows it
/// printed (so a test can run a protocol of its own through the same path).
///
/// # Errors
/// A bad flag, an unknown protocol (the error lists the registered ones), a run that could
/// not be built, or a failed checker / invariants verdict.
pub fn run(args: Args, registry: &Registry) -> anyhow::Result<Vec<Row>> {
    let (workload, scale, profile, faults) = args.validate(registry)?;
    let mut sink = Sink::new(args.json, args.csv.as_deref())?.with_columns(CSV_COLUMNS);
    let mut rows = Vec::new();
    for protocol in &args.protocol {
        let row = run_protocol(&args, registry, &workload, &profile, faults, protocol)?;
        sink.row(&row)?;
        rows.push(row);
    }
    if !args.json {
        let any_symmetric = args
            .protocol
            .iter()
            .any(|p| registry.get(p).is_ok_and(|p| p.symmetric()));
        let servers = if any_symmetric {
            format!(" ({} servers if symmetric)", args.servers)
        } else {
            String::new()
        };
        println!(
            "dmem bench  workload {} ({} scale, {:.1} MB of values)  sim {}  {} MN  {} CN{servers} x {} threads x {} coroutines  {} ms  seed {}{}{}",
            args.workload.name(),
            scale.name(),
            workload.value_bytes() as f64 / 1e6,
            profile.name,
            args.mns,
            args.cns,
            args.threads,
            args.coroutines,
            args.duration_ms,
            args.seed,
            if args.backoff == Backoff::None {
                String::new()
            } else {
                format!("  backoff {}", args.backoff)
            },
            describe_faults(&faults)
        );
        print_table(&rows);
    }
    let verdicts = rows.iter().map(|r| {
        // With `--workload append` both checkers must pass.
        let checker = match r.version_checker.as_deref() {
            Some(v) if r.checker == "ok" && v != "ok" => v,
            _ => r.checker.as_str(),
        };
        (
            r.protocol.as_str(),
            checker,
            r.invariants.as_str(),
            r.committed,
        )
    });
    finish_checked(sink, &args, verdicts, &[])?;
    Ok(rows)
}

/// The table of `dmem bench` (on every fabric) from its rows: one line per protocol, a
/// figure the fabric does not measure as `-`; under it each protocol's counters and aborts
/// by reason, and each protocol's throughput against the first's.
pub fn print_table(rows: &[Row]) {
    let mut t = common::table(&[
        "protocol",
        "Mtps",
        "aborts",
        "p50 µs",
        "p99 µs",
        "READ",
        "WRITE",
        "CAS",
        "FAA",
        "MN busy",
        "CN cpu",
        "msgs",
        "rtts",
        "RO 1rt",
        "msg/pkt",
        "checker / invariants",
    ]);
    let fixed = |x: Option<f64>, digits: usize| {
        x.map_or_else(|| "-".to_owned(), |x| format!("{x:.digits$}"))
    };
    let percent =
        |x: Option<f64>| x.map_or_else(|| "-".to_owned(), |x| format!("{:.0}%", x * 100.0));
    for r in rows {
        t.add_row(vec![
            r.protocol.clone(),
            format!("{:.3}", r.mtps),
            format!("{:.1}%", r.abort_rate * 100.0),
            format!("{:.1}", r.p50_us),
            format!("{:.1}", r.p99_us),
            fixed(r.mn_reads_per_txn, 2),
            fixed(r.mn_writes_per_txn, 2),
            fixed(r.mn_cas_per_txn, 2),
            fixed(r.mn_faa_per_txn, 2),
            percent(r.mn_nic_busy),
            percent(r.cn_cpu_busy),
            fixed(r.msgs_per_txn, 2),
            fixed(
                r.rtts_per_txn
                    .as_ref()
                    .map(|m| m.get("all").copied().unwrap_or(0.0)),
                2,
            ),
            r.ro_one_rtt_share
                .map_or_else(|| "-".to_owned(), |x| format!("{:.1}%", x * 100.0)),
            r.msgs_per_packet.map_or_else(
                || "-".to_owned(),
                |m| format!("{m:.2} ({:.0} B)", r.packet_bytes.unwrap_or(0.0)),
            ),
            match &r.version_checker {
                Some(v) => format!("append {} / versions {v} / {}", r.checker, r.invariants),
                None => format!("{} / {}", r.checker, r.invariants),
            },
        ]);
    }
    println!("{}", common::render(&t));
    print_breakdowns(rows.iter().map(|r| {
        (
            r.protocol.as_str(),
            &r.counters,
            &r.aborts_by_reason,
            None::<&BTreeMap<String, u64>>,
        )
    }));
    if rows.len() > 1 {
        let base = &rows[0];
        for r in &rows[1..] {
            println!(
                "{} / {}: {:.3}x throughput",
                r.protocol,
                base.protocol,
                r.mtps / base.mtps.max(f64::MIN_POSITIVE)
            );
        }
    }
}

/// The per-node row of a symmetric protocol's run on a real fabric in one process
/// (`dmem bench --fabric shm` of dnl-*, fasst), beside its protocol's [`Row`]: the node is
/// this process (`node` = `process`, `role` = `servers`), with what only a real-time run
/// in one process measures (CPU time of its executor thread, messages and packets per
/// second, the host's load).
#[derive(Debug, Clone, Serialize)]
pub struct ServersRow {
    /// `process`: every server of the run is in this process.
    node: &'static str,
    /// Protocol.
    pub protocol: String,
    /// `servers`.
    role: &'static str,
    /// `ok`: the run ended (an error ends the command instead).
    exit: &'static str,
    workload: String,
    scale: String,
    fabric: String,
    servers: u16,
    threads: u16,
    coroutines: u16,
    seed: u64,
    /// Tries per transaction (`--attempts`).
    attempts: u32,
    /// Measured real time, ms.
    elapsed_ms: f64,
    /// The host's load average (1, 5, 15 min) when the row finished.
    load_average: String,
    /// Committed transactions per second of real time, thousands.
    pub ktps: f64,
    /// CPU time of the executor thread in the measured time, ms (its share of a core on
    /// a loaded host is the rest of the real time).
    cpu_ms: f64,
    /// Committed transactions per CPU second of the executor thread, thousands: the
    /// figure that does not move with the host's load.
    pub ktps_per_cpu_s: f64,
    abort_rate: f64,
    p50_us: f64,
    p99_us: f64,
    /// Committed in the measured time.
    pub committed: u64,
    rolled_back: u64,
    given_up: u64,
    /// Failed attempts of the measured transactions by reason (the protocol's abort reason,
    /// else the error), a given-up transaction's last try included.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub aborts_by_reason: BTreeMap<String, u64>,
    /// Transactions given up after every try (measured), by error.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub given_up_by_error: BTreeMap<String, u64>,
    /// RPC messages (requests and responses) sent per second, thousands.
    pub kmsgs_per_s: f64,
    /// RPC messages sent per CPU second of the executor thread, thousands.
    pub kmsgs_per_cpu_s: f64,
    /// Packets sent per second, thousands.
    pub kpackets_per_s: f64,
    /// Messages per packet.
    pub msgs_per_packet: Option<f64>,
    packet_bytes: Option<f64>,
    /// Verdict of the history checker.
    pub checker: String,
    /// Verdict of the workload's consistency checks.
    pub invariants: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    counters: BTreeMap<String, u64>,
}

/// The host's load average (1, 5 and 15 minutes), as `/proc/loadavg` says.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

impl Args {
    /// Whether every protocol asked for is symmetric (`dmem bench --fabric shm` runs
    /// those in this process, [`run_servers`]; `--fabric tcp` runs every protocol as
    /// processes); an error if symmetric and other protocols are mixed (the others run as
    /// separate MN and CN processes).
    ///
    /// # Errors
    /// An unknown protocol, or a mix.
    pub fn symmetric_only(&self, registry: &Registry) -> anyhow::Result<bool> {
        let mut symmetric = Vec::new();
        for p in &self.protocol {
            symmetric.push(registry.get(p).context("in --protocol")?.symmetric());
        }
        let all = symmetric.iter().all(|&s| s);
        ensure!(
            all || !symmetric.iter().any(|&s| s),
            "--fabric {}: symmetric protocols (dnl-*, fasst) run their servers in this process, the others as MN and CN processes: bench them separately",
            self.fabric.name()
        );
        Ok(all)
    }
}

/// `dmem bench --fabric shm|tcp` of symmetric protocols: `--servers` servers × `--threads`
/// message loops × `--coroutines` coordinators each, on one real-time executor thread in
/// this process (`dmem_harness::servers`), for `--duration-ms` of real time (at least 1000)
/// after a tenth of it as warm-up; the whole history checked.
///
/// # Errors
/// As [`run`].
pub fn run_servers(args: Args, registry: &Registry) -> anyhow::Result<(Vec<Row>, Vec<ServersRow>)> {
    use dmem_harness::fabric::Fabric;
    use dmem_harness::servers::{RunLength, ServersConfig};
    ensure!(
        args.cluster.is_none(),
        "--cluster FILE: symmetric protocols run in this process, without a cluster file"
    );
    ensure!(
        !args.protocol.is_empty(),
        "--protocol needs at least one protocol name"
    );
    common::no_duplicates("protocol", &args.protocol)?;
    args.message_faults(registry)?;
    let (mut workload, scale) = parse_workload(args.workload.name(), args.scale.name())?;
    if let Some(mix) = &args.mix {
        workload = workload_mix(args.workload.name(), scale, mix)?;
    }
    for p in &args.protocol {
        let bytes = memory_estimate(registry, p, &workload, 1, 1)?;
        common::ensure_memory(
            bytes,
            &format!(
                "{} at --scale {} under {p}",
                args.workload.name(),
                scale.name()
            ),
            "--scale (tiny, small)",
        )?;
    }
    let fabric = match args.fabric {
        TxnFabric::Tcp => Fabric::Tcp,
        TxnFabric::Shm => Fabric::Shm,
        TxnFabric::Sim | TxnFabric::Rdma => anyhow::bail!(
            "--fabric {}: the symmetric protocols (dnl-*, fasst) run their servers on sim, tcp and shm; on rdma their batched RPCs need queue pairs between servers, which dmem does not make yet",
            args.fabric.name()
        ),
    };
    let duration_ms = args.duration_ms.max(1000);
    let cfg = ServersConfig {
        fabric,
        servers: args.servers,
        threads: args.threads,
        coroutines: args.coroutines,
        seed: args.seed,
        length: RunLength::Duration(std::time::Duration::from_millis(duration_ms)),
        check: !args.no_check,
        max_attempts: args.attempts,
        backoff: args.backoff,
    };
    let mut sink = Sink::new(args.json, args.csv.as_deref())?.with_columns(CSV_COLUMNS);
    if !args.json {
        println!(
            "dmem bench  workload {} ({} scale)  {fabric} in one process, one executor thread  {} servers x {} threads x {} coroutines  {duration_ms} ms real time  {} attempts  backoff {}  seed {}  load average {} at start, {} cores",
            args.workload.name(),
            scale.name(),
            args.servers,
            args.threads,
            args.coroutines,
            args.attempts,
            args.backoff,
            args.seed,
            load_average(),
            std::thread::available_parallelism().map_or(0, |n| n.get()),
        );
    }
    let (mut rows, mut nodes) = (Vec::new(), Vec::new());
    for protocol in &args.protocol {
        let p = registry.get(protocol)?;
        let r = dmem_harness::servers::run_servers(&*p, &workload, &cfg)
            .with_context(|| format!("running {protocol} on {fabric}"))?;
        let row = Row {
            protocol: protocol.clone(),
            workload: args.workload.name().to_owned(),
            scale: scale.name().to_owned(),
            profile: None,
            seed: Some(args.seed),
            duration_ms,
            backoff: args.backoff.to_string(),
            // Six decimals, as across processes: a real-time run may commit little.
            mtps: round(r.tps / 1e6, 6),
            abort_rate: round(r.abort_rate, 4),
            p50_us: round(r.p50_us, 2),
            p99_us: round(r.p99_us, 2),
            mn_reads_per_txn: None,
            mn_writes_per_txn: None,
            mn_cas_per_txn: None,
            mn_faa_per_txn: None,
            mn_nic_busy: None,
            committed: r.committed,
            rolled_back: r.rolled_back,
            failed: r.given_up.values().sum(),
            checker: r.checker.clone(),
            version_checker: None,
            checked_txns: r.checked_txns,
            invariants: r.invariants.clone(),
            rtts_per_txn: None,
            ro_one_rtt_share: None,
            cn_cpu_busy: None,
            msgs_per_txn: None,
            msgs_per_packet: r.msgs_per_packet.map(|m| round(m, 2)),
            packet_bytes: r.packet_bytes.map(|b| round(b, 1)),
            counters: r.counters.clone(),
            aborts_by_reason: r.aborts.clone(),
            committed_per_type: r.committed_per_type.clone(),
        };
        sink.row(&row)?;
        rows.push(row);
        let node = ServersRow {
            node: "process",
            protocol: protocol.clone(),
            role: "servers",
            exit: "ok",
            workload: args.workload.name().to_owned(),
            scale: scale.name().to_owned(),
            fabric: fabric.to_string(),
            servers: args.servers,
            threads: args.threads,
            coroutines: args.coroutines,
            seed: args.seed,
            attempts: args.attempts,
            elapsed_ms: round(r.elapsed_s * 1e3, 1),
            load_average: load_average(),
            ktps: round(r.tps / 1e3, 3),
            cpu_ms: round(r.cpu_s * 1e3, 1),
            ktps_per_cpu_s: round(r.tps_per_cpu_s / 1e3, 3),
            abort_rate: round(r.abort_rate, 4),
            p50_us: round(r.p50_us, 1),
            p99_us: round(r.p99_us, 1),
            committed: r.committed,
            rolled_back: r.rolled_back,
            given_up: r.given_up.values().sum(),
            aborts_by_reason: r.aborts,
            given_up_by_error: r.given_up,
            kmsgs_per_s: round(r.messages_per_s / 1e3, 2),
            kmsgs_per_cpu_s: round(r.messages_per_cpu_s / 1e3, 2),
            kpackets_per_s: round(r.packets_per_s / 1e3, 2),
            msgs_per_packet: r.msgs_per_packet.map(|m| round(m, 3)),
            packet_bytes: r.packet_bytes.map(|b| round(b, 1)),
            checker: r.checker,
            invariants: r.invariants,
            counters: r.counters,
        };
        sink.row(&node)?;
        nodes.push(node);
    }
    if !args.json {
        print_table(&rows);
        // This process's detail (the node rows): CPU time, messages and packets.
        let mut t = common::table(&[
            "protocol",
            "ktps",
            "cpu ms",
            "ktps/cpu-s",
            "aborts",
            "p50 µs",
            "p99 µs",
            "kmsgs/s",
            "kmsgs/cpu-s",
            "kpkts/s",
            "msg/pkt",
            "load avg",
            "checker / invariants",
        ]);
        for r in &nodes {
            t.add_row(vec![
                r.protocol.clone(),
                format!("{:.2}", r.ktps),
                format!("{:.0}", r.cpu_ms),
                format!("{:.2}", r.ktps_per_cpu_s),
                format!("{:.1}%", r.abort_rate * 100.0),
                format!("{:.1}", r.p50_us),
                format!("{:.1}", r.p99_us),
                format!("{:.1}", r.kmsgs_per_s),
                format!("{:.1}", r.kmsgs_per_cpu_s),
                format!("{:.1}", r.kpackets_per_s),
                r.msgs_per_packet.map_or_else(
                    || "-".to_owned(),
                    |m| format!("{m:.2} ({:.0} B)", r.packet_bytes.unwrap_or(0.0)),
                ),
                r.load_average.clone(),
                format!("{} / {}", r.checker, r.invariants),
            ]);
        }
        println!("{}", common::render(&t));
        let none = BTreeMap::new();
        print_breakdowns(nodes.iter().map(|r| {
            (
                r.protocol.as_str(),
                &none,
                &none,
                Some(&r.given_up_by_error),
            )
        }));
        for r in nodes.iter().skip(1) {
            println!(
                "{} / {}: {:.3}x throughput per CPU second, {:.3}x messages per CPU second",
                r.protocol,
                nodes[0].protocol,
                r.ktps_per_cpu_s / nodes[0].ktps_per_cpu_s.max(f64::MIN_POSITIVE),
                r.kmsgs_per_cpu_s / nodes[0].kmsgs_per_cpu_s.max(f64::MIN_POSITIVE)
            );
        }
    }
    let verdicts = rows.iter().map(|r| {
        (
            r.protocol.as_str(),
            r.checker.as_str(),
            r.invariants.as_str(),
            r.committed,
        )
    });
    finish_checked(sink, &args, verdicts, &[])?;
    Ok((rows, nodes))
}

/// Ends a `bench` run: the summary names the protocols whose checker or invariants
/// failed (`(protocol, checker, invariants, committed)` per row) or whose run found other
/// `problems` (`(protocol, problem)`: across processes, a node that failed or printed no
/// report), and so does the error if any did; a protocol that committed nothing is an
/// error too (its verdicts judged nothing).
///
/// # Errors
/// A check failed ([`CheckFailed`]), a protocol committed nothing, or the CSV file cannot
/// be written.
pub fn finish_checked<'a>(
    sink: Sink,
    args: &Args,
    verdicts: impl Iterator<Item = (&'a str, &'a str, &'a str, u64)>,
    problems: &[(String, String)],
) -> anyhow::Result<()> {
    let verdicts: Vec<_> = verdicts.collect();
    let mut bad: Vec<&str> = verdicts
        .iter()
        .filter(|(_, checker, invariants, _)| {
            !(*checker == "ok" || *checker == "skipped") || *invariants != "ok"
        })
        .map(|(protocol, ..)| *protocol)
        .collect();
    for (protocol, _) in problems {
        if !bad.contains(&protocol.as_str()) {
            bad.push(protocol);
        }
    }
    sink.finish("bench", args, serde_json::json!({ "check_failed": bad }))?;
    if !problems.is_empty() {
        let lines: Vec<String> = problems.iter().map(|(p, e)| format!("{p}: {e}")).collect();
        return Err(CheckFailed(format!("cluster check failed: {}", lines.join("; "))).into());
    }
    if !bad.is_empty() {
        return Err(CheckFailed(format!(
            "correctness check failed for {}: see the checker / invariants column",
            bad.join(", ")
        ))
        .into());
    }
    for (protocol, .., committed) in verdicts {
        common::committed_something(
            &format!("protocol `{protocol}`"),
            committed,
            "raise --duration-ms",
        )?;
    }
    Ok(())
}

/// The lines under a `bench` table, per row: the deployment's counters, aborts by reason
/// and (real-fabric rows) transactions given up by error, each only where not empty.
fn print_breakdowns<'a>(
    rows: impl Iterator<
        Item = (
            &'a str,
            &'a BTreeMap<String, u64>,
            &'a BTreeMap<String, u64>,
            Option<&'a BTreeMap<String, u64>>,
        ),
    >,
) {
    for (protocol, counters, aborts, given_up) in rows {
        if !counters.is_empty() {
            let c: Vec<String> = counters.iter().map(|(k, v)| format!("{k} {v}")).collect();
            println!("{protocol}: {}", c.join(", "));
        }
        if !aborts.is_empty() {
            println!("{protocol} aborts by reason: {}", common::by_count(aborts));
        }
        if let Some(g) = given_up.filter(|g| !g.is_empty()) {
            println!("{protocol} given up by error: {}", common::by_count(g));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`CSV_COLUMNS`] is every field of [`Row`] in order (each optional one present), then
    /// the node rows' `node` and `role`.
    #[test]
    fn csv_columns_are_the_row_fields() {
        let one = |k: &str| BTreeMap::from([(k.to_owned(), 1)]);
        let mut row = Row::across_processes(
            "ford",
            "smallbank",
            "tiny",
            1000,
            "none",
            ProcessTally {
                counters: one("c"),
                aborts_by_reason: one("a"),
                ..ProcessTally::default()
            },
            "ok".into(),
            0,
            "ok".into(),
        );
        row.version_checker = Some("ok".into());
        let serde_json::Value::Object(fields) = serde_json::to_value(&row).unwrap() else {
            panic!("a row is an object");
        };
        let keys: Vec<&str> = fields.keys().map(String::as_str).collect();
        assert_eq!(keys, CSV_COLUMNS[..CSV_COLUMNS.len() - 2]);
        assert_eq!(CSV_COLUMNS[CSV_COLUMNS.len() - 2..], ["node", "role"]);
        // Nothing measured is not a number: the fields real contexts do not count are null.
        assert!(fields["mn_reads_per_txn"].is_null() && fields["rtts_per_txn"].is_null());
    }
}

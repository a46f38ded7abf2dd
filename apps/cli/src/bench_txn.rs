//! `dmem bench --workload W --protocol P,...`: transaction protocols side by side.
//!
//! For each protocol the same workload (same scale, same seeds, same cluster) runs on its own
//! simulated cluster: the data set is loaded out of band, every coordinator runs a closed loop
//! of the workload's transactions (protocol aborts are retried with the same parameters, as
//! the benchmarks do), and after the run the whole recorded history goes through the
//! serializability checker and the final state through the workload's consistency checks.

use std::collections::BTreeMap;

use anyhow::{Context as _, ensure};
use clap::Args as ClapArgs;
use dmem_deploy::{ClusterShape, Registry};
use dmem_harness::{BenchConfig, run_bench};
use dmem_sim::NicProfile;
use dmem_verbs::Nanos;
use dmem_workloads::{AnyWorkload, Scale, Workload};
use serde::Serialize;

/// Arguments of the transaction benchmark (`dmem bench` without a subcommand).
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Workload: kvs, ycsb, smallbank, tatp, tpcc.
    #[arg(long, default_value = "smallbank")]
    workload: String,
    /// Size preset of the workload: tiny, small, ford, motor, lotus.
    #[arg(long, default_value = "small")]
    scale: String,
    /// YCSB mix (with `--workload ycsb`): read-only, read-intensive (the default), a, b, c, f.
    #[arg(long)]
    mix: Option<String>,
    /// Protocols to run side by side, comma-separated: any registered name — ford, occ
    /// (OOCC's OCC baseline: fixed FORD), oocc, pandora, pandora-lock-logging (traditional "log before lock" instead of PILL,
    /// Pandora §6.1), or ford:BUG[+BUG] for FORD with bugs of Pandora Table 1 switched on.
    #[arg(long, value_delimiter = ',', default_value = "ford,pandora")]
    protocol: Vec<String>,
    /// Fabric (only the simulated cluster runs transaction protocols so far).
    #[arg(long, default_value = "sim")]
    fabric: String,
    /// NIC profile of the simulated cluster.
    #[arg(long, default_value = "cx5")]
    profile: String,
    /// Memory nodes (replication degree min(3, MNs)).
    #[arg(long, default_value_t = 3)]
    mns: u16,
    /// Compute nodes.
    #[arg(long, default_value_t = 2)]
    cns: u16,
    /// Threads (cores) per CN.
    #[arg(long, default_value_t = 4)]
    threads: u16,
    /// Coroutines (coordinators) per thread.
    #[arg(long, default_value_t = 8)]
    coroutines: u16,
    /// Measured duration, ms of virtual time (after a 10 % warm-up).
    #[arg(long, default_value_t = 10)]
    duration_ms: u64,
    /// Seed of the cluster and of every coordinator's transaction generator.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Skip the history checker (it runs on the whole recorded history by default).
    #[arg(long)]
    no_check: bool,
    /// Start every CN with a cold address cache (the first access to each record then
    /// costs an index-bucket READ first). By default each CN starts warm, as after scanning
    /// the index once at start-up: FORD's own code reads an item with its bucket in one
    /// READ, so only a warm cache compares round trips like for like.
    #[arg(long)]
    cold_cache: bool,
    /// Print one JSON object per protocol instead of a table.
    #[arg(long)]
    json: bool,
}

/// One protocol's results.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub protocol: String,
    workload: String,
    scale: String,
    /// Committed transactions per second of virtual time, millions.
    mtps: f64,
    /// Aborted attempts / all attempts.
    abort_rate: f64,
    /// Median latency of a committed transaction (first begin to commit, retries included), µs.
    p50_us: f64,
    /// 99th-percentile latency, µs.
    p99_us: f64,
    /// MN NIC work requests per committed transaction, by kind.
    mn_reads_per_txn: f64,
    mn_writes_per_txn: f64,
    mn_cas_per_txn: f64,
    mn_faa_per_txn: f64,
    /// Busiest MN NIC resource's busy fraction.
    mn_nic_busy: f64,
    pub committed: u64,
    /// Transactions the workload itself rolled back (not protocol aborts).
    rolled_back: u64,
    /// Transactions given up after too many aborts.
    failed: u64,
    /// Verdict of the history checker: "ok", "skipped", or the first anomaly.
    pub checker: String,
    /// Transactions in the checked history.
    checked_txns: usize,
    /// Verdict of the workload's consistency checks: "ok" or the first violation.
    pub invariants: String,
    /// Mean round trips (post lists awaited) of a committed transaction, per transaction
    /// type and under `all`.
    pub rtts_per_txn: BTreeMap<String, f64>,
    /// Share of committed read-only transactions that took no round trip beyond their
    /// execution rounds (no validation): for one-round ones, committed in one round trip.
    pub ro_one_rtt_share: Option<f64>,
}

impl Args {
    fn validate(&self, registry: &Registry) -> anyhow::Result<(AnyWorkload, Scale, NicProfile)> {
        ensure!(
            self.fabric == "sim",
            "--fabric {}: transaction protocols run on the simulated cluster so far (--fabric sim)",
            self.fabric
        );
        ensure!(self.mns > 0, "--mns must be at least 1");
        ensure!(self.cns > 0, "--cns must be at least 1");
        ensure!(self.threads > 0, "--threads must be at least 1");
        ensure!(self.coroutines > 0, "--coroutines must be at least 1");
        ensure!(self.duration_ms > 0, "--duration-ms must be at least 1");
        ensure!(
            !self.protocol.is_empty(),
            "--protocol needs at least one protocol"
        );
        let coordinators =
            u32::from(self.cns) * u32::from(self.threads) * u32::from(self.coroutines);
        ensure!(
            coordinators < u32::from(u16::MAX),
            "{coordinators} coordinators exceed the 16-bit coordinator ids: lower --cns, --threads or --coroutines"
        );
        for p in &self.protocol {
            registry.get(p).context("in --protocol")?;
        }
        let (mut workload, scale) = parse_workload(&self.workload, &self.scale)?;
        if let Some(mix) = &self.mix {
            workload = ycsb_mix(&self.workload, scale, mix)?;
        }
        let profile = NicProfile::named(&self.profile)?;
        Ok((workload, scale, profile))
    }

    fn config(&self, profile: &NicProfile) -> BenchConfig {
        BenchConfig {
            shape: ClusterShape {
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
            "unknown --workload `{}`: use kvs, ycsb, smallbank, tatp or tpcc",
            e.0
        )
    })?;
    Ok((workload, scale))
}

/// YCSB with the mix named by `--mix`.
fn ycsb_mix(workload: &str, scale: Scale, mix: &str) -> anyhow::Result<AnyWorkload> {
    use dmem_workloads::kv::{KvConfig, KvWorkload, YcsbMix};
    ensure!(workload == "ycsb", "--mix applies to --workload ycsb only");
    let mix = match mix {
        "read-only" => YcsbMix::ReadOnly,
        "read-intensive" => YcsbMix::ReadIntensive,
        "a" => YcsbMix::A,
        "b" => YcsbMix::B,
        "c" => YcsbMix::C,
        "f" => YcsbMix::F,
        other => {
            anyhow::bail!("unknown --mix `{other}`: use read-only, read-intensive, a, b, c or f")
        }
    };
    Ok(AnyWorkload::Kv(KvWorkload::new(KvConfig::ycsb(scale, mix))))
}

fn run_protocol(
    args: &Args,
    registry: &Registry,
    workload: &AnyWorkload,
    profile: &NicProfile,
    protocol: &str,
) -> anyhow::Result<Row> {
    let p = registry.get(protocol)?;
    let cfg = args.config(profile);
    let warm_up_end = cfg.duration / 10;
    let progress = progress_bar(args, protocol, warm_up_end + cfg.duration);
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
        workload: args.workload.clone(),
        scale: args.scale.clone(),
        mtps: r.mtps,
        abort_rate: r.abort_rate,
        p50_us: r.p50_us,
        p99_us: r.p99_us,
        mn_reads_per_txn: r.mn_per_txn[0],
        mn_writes_per_txn: r.mn_per_txn[1],
        mn_cas_per_txn: r.mn_per_txn[2],
        mn_faa_per_txn: r.mn_per_txn[3],
        mn_nic_busy: r.mn_nic_busy,
        committed: r.committed,
        rolled_back: r.rolled_back,
        failed: r.failed,
        checker: r.checker,
        checked_txns: r.checked_txns,
        invariants: r.invariants,
        rtts_per_txn: r.rtts_per_txn,
        ro_one_rtt_share: (r.ro_committed > 0)
            .then(|| r.ro_no_validation as f64 / r.ro_committed as f64),
    })
}

fn progress_bar(args: &Args, protocol: &str, end: Nanos) -> indicatif::ProgressBar {
    if args.json {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(end / 1_000);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{prefix:>10} [{bar:30}] {pos}/{len} µs virtual  {elapsed} real",
        )
        .expect("static template is valid")
        .progress_chars("=> "),
    );
    bar.set_prefix(protocol.to_string());
    bar
}

/// Runs the transaction benchmark on the protocols of `registry`; returns the rows it
/// printed (so a test can run a protocol of its own through the same path).
///
/// # Errors
/// A bad flag, an unknown protocol (the error lists the registered ones), a run that could
/// not be built, or a failed checker / invariants verdict.
pub fn run(args: Args, registry: &Registry) -> anyhow::Result<Vec<Row>> {
    let (workload, scale, profile) = args.validate(registry)?;
    let mut rows = Vec::new();
    for protocol in &args.protocol {
        let row = run_protocol(&args, registry, &workload, &profile, protocol)?;
        if args.json {
            println!("{}", serde_json::to_string(&row)?);
        }
        rows.push(row);
    }
    if !args.json {
        println!(
            "dmem bench  workload {} ({} scale, {:.1} MB of values)  sim {}  {} MN  {} CN x {} threads x {} coroutines  {} ms  seed {}",
            args.workload,
            scale.name(),
            workload.value_bytes() as f64 / 1e6,
            profile.name,
            args.mns,
            args.cns,
            args.threads,
            args.coroutines,
            args.duration_ms,
            args.seed
        );
        println!(
            "{:<20} {:>8} {:>7} {:>8} {:>8} {:>6} {:>6} {:>6} {:>6} {:>7} {:>6} {:>7}  checker / invariants",
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
            "rtts",
            "RO 1rt"
        );
        for r in &rows {
            println!(
                "{:<20} {:>8.3} {:>6.1}% {:>8.1} {:>8.1} {:>6.2} {:>6.2} {:>6.2} {:>6.2} {:>6.0}% {:>6.2} {:>7}  {} / {}",
                r.protocol,
                r.mtps,
                r.abort_rate * 100.0,
                r.p50_us,
                r.p99_us,
                r.mn_reads_per_txn,
                r.mn_writes_per_txn,
                r.mn_cas_per_txn,
                r.mn_faa_per_txn,
                r.mn_nic_busy * 100.0,
                r.rtts_per_txn.get("all").copied().unwrap_or(0.0),
                r.ro_one_rtt_share
                    .map_or_else(|| "-".to_owned(), |x| format!("{:.1}%", x * 100.0)),
                r.checker,
                r.invariants
            );
        }
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
    let bad: Vec<_> = rows
        .iter()
        .filter(|r| !(r.checker == "ok" || r.checker == "skipped") || r.invariants != "ok")
        .map(|r| r.protocol.as_str())
        .collect();
    ensure!(
        bad.is_empty(),
        "correctness check failed for {}: see the checker / invariants column",
        bad.join(", ")
    );
    Ok(rows)
}

//! `dmem bench --workload W --protocol P,...`: transaction protocols side by side.
//!
//! For each protocol the same workload (same scale, same seeds, same cluster) runs on its own
//! simulated cluster: the data set is loaded out of band, every coordinator runs a closed loop
//! of the workload's transactions (protocol aborts are retried with the same parameters, as
//! the benchmarks do), and after the run the whole recorded history goes through the
//! serializability checker and the final state through the workload's consistency checks.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use anyhow::{Context as _, bail, ensure};
use clap::Args as ClapArgs;
use dmem_ford::store::{BUCKET_LEN, parse_bucket};
use dmem_ford::{
    BugSet, CnShared, FordCoordinator, Loader, ProtocolConfig, Store, StoreConfig, StoreError,
    TableSpec,
};
use dmem_layout::pill::{FailedCoordinatorSet, LockHolder, PillLockWord};
use dmem_layout::record::DataItem;
use dmem_sim::{ClusterConfig, NicProfile, Sim};
use dmem_txn::{History, Key, TableId, TxnOutcome, check};
use dmem_verbs::{Clock, MemoryRegion, Nanos, NodeId, OpKind, RKey};
use dmem_workloads::{AnyWorkload, Executed, Outcome, Scale, TxnGenerator, Workload, execute};
use hdrhistogram::Histogram;
use serde::Serialize;

/// Arguments of the transaction benchmark (`dmem bench` without a subcommand).
#[derive(Debug, ClapArgs)]
pub(crate) struct Args {
    /// Workload: kvs, ycsb, smallbank, tatp, tpcc.
    #[arg(long, default_value = "smallbank")]
    workload: String,
    /// Size preset of the workload: tiny, small, ford, motor, lotus.
    #[arg(long, default_value = "small")]
    scale: String,
    /// Protocols to run side by side, comma-separated: ford, pandora,
    /// pandora-lock-logging (traditional "log before lock" instead of PILL, Pandora §6.1),
    /// or ford:BUG[+BUG] for FORD with bugs of Pandora Table 1 switched on.
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
    /// Print one JSON object per protocol instead of a table.
    #[arg(long)]
    json: bool,
}

/// One protocol's results.
#[derive(Debug, Serialize)]
struct Row {
    protocol: String,
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
    committed: u64,
    /// Transactions the workload itself rolled back (not protocol aborts).
    rolled_back: u64,
    /// Transactions given up after too many aborts.
    failed: u64,
    /// Verdict of the history checker: "ok", "skipped", or the first anomaly.
    checker: String,
    /// Transactions in the checked history.
    checked_txns: usize,
    /// Verdict of the workload's consistency checks: "ok" or the first violation.
    invariants: String,
}

/// Tries before a transaction is given up (retries reuse its parameters).
pub(crate) const MAX_ATTEMPTS: u32 = 64;

/// The protocol named on the command line.
pub(crate) fn protocol_config(name: &str) -> anyhow::Result<ProtocolConfig> {
    match name.split_once(':') {
        None if name == "ford" => Ok(ProtocolConfig::ford_fixed()),
        None if name == "pandora" => Ok(ProtocolConfig::pandora()),
        None if name == "pandora-lock-logging" => Ok(ProtocolConfig::pandora_lock_logging()),
        Some(("ford", bugs)) => {
            let bugs = BugSet::parse(&bugs.replace('+', ","))
                .map_err(|e| anyhow::anyhow!("{e}"))
                .context("in --protocol ford:BUG+BUG")?;
            Ok(ProtocolConfig::ford_with(bugs))
        }
        _ => bail!(
            "unknown protocol `{name}`: use ford, pandora, pandora-lock-logging or ford:BUG[+BUG]"
        ),
    }
}

impl Args {
    fn validate(&self) -> anyhow::Result<(AnyWorkload, Scale, NicProfile)> {
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
            protocol_config(p)?;
        }
        let (workload, scale) = parse_workload(&self.workload, &self.scale)?;
        let profile = NicProfile::named(&self.profile)?;
        Ok((workload, scale, profile))
    }

    fn shape(&self) -> ClusterShape {
        ClusterShape {
            mns: self.mns,
            cns: self.cns,
            threads: self.threads,
            coordinators: self.cns * self.threads * self.coroutines,
            seed: self.seed,
        }
    }
}

/// The workload and scale named on the command line.
pub(crate) fn parse_workload(workload: &str, scale: &str) -> anyhow::Result<(AnyWorkload, Scale)> {
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

/// The simulated cluster a run needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClusterShape {
    /// Memory nodes.
    pub(crate) mns: u16,
    /// Compute nodes (all of them, including any that run no coordinator).
    pub(crate) cns: u16,
    /// Threads per CN.
    pub(crate) threads: u16,
    /// Coordinators (each needs a log region).
    pub(crate) coordinators: u16,
    /// Seed of the cluster.
    pub(crate) seed: u64,
}

/// The FORD/Pandora store configuration for `workload` on `mns` MNs, with index room for
/// `slack` times the records each table holds.
///
/// The store's hash index has no overflow buckets yet (a full bucket refuses the record), so
/// the index is over-provisioned: `slack` starts at 2 (buckets a quarter full on average)
/// and doubles when loading finds a full bucket.
fn store_config(workload: &AnyWorkload, mns: u16, coordinators: u16, slack: u64) -> StoreConfig {
    let mut cfg = StoreConfig::new(mns).coordinators(coordinators);
    for table in workload.tables() {
        // Tables that grow while the benchmark runs get room for as many inserts again.
        let records = if table.grows {
            table.expected_records * 2 + 4096
        } else {
            table.expected_records + 64
        };
        cfg = cfg.table(TableSpec::sized_for(
            table.id,
            table.value_size,
            records * slack,
            mns,
        ));
    }
    cfg
}

/// A simulated cluster with the workload loaded into a FORD/Pandora store.
pub(crate) fn build_cluster(
    args: &ClusterShape,
    workload: &AnyWorkload,
    profile: &NicProfile,
) -> anyhow::Result<(Sim, Rc<Store>)> {
    let coordinators = args.coordinators;
    let mut slack = 2;
    loop {
        let store_cfg = store_config(workload, args.mns, coordinators, slack);
        // Size MN memory from the layout itself: lay it out once over unbounded regions.
        let probe_regions = (0..args.mns)
            .map(|i| MemoryRegion {
                node: NodeId(i),
                rkey: RKey(0),
                len: u64::MAX / 4,
            })
            .collect();
        let bytes_per_mn = Store::new(store_cfg.clone(), probe_regions)?.bytes_per_mn();
        let sim = Sim::new(
            ClusterConfig::with_profile(profile.clone())
                .mns(args.mns)
                .cns(args.cns)
                .threads_per_cn(args.threads)
                .mn_memory_bytes(bytes_per_mn.max(1 << 20))
                .seed(args.seed),
        )?;
        let regions = (0..args.mns).map(|i| sim.region(sim.mn(i))).collect();
        let store = Rc::new(Store::new(store_cfg, regions)?);
        let mut loader = Loader::new(&store);
        let mut full = false;
        for (table, key, value) in workload.loader() {
            match loader.load(table, key, &value, |node, offset, bytes| {
                sim.write_memory(node, offset, bytes);
            }) {
                Ok(_) => {}
                Err(StoreError::BucketFull { .. }) if slack < 32 => {
                    full = true;
                    break;
                }
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("loading table {} key {}", table.0, key.0));
                }
            }
        }
        if !full {
            return Ok((sim, store));
        }
        slack *= 2;
    }
}

/// Reads the committed value of `(table, key)` from its primary's memory (after the run,
/// outside virtual time), for the workload's consistency checks.
pub(crate) fn read_record(sim: &Sim, store: &Store, table: TableId, key: Key) -> Option<Vec<u8>> {
    read_record_past_stray(sim, store, table, key, &FailedCoordinatorSet::EMPTY)
}

/// [`read_record`] that reads through a lock held by one of `failed`: a stray lock that
/// PILL lets readers ignore and writers steal (Pandora §3.1.2), left by a crashed
/// coordinator's not-logged transaction.
pub(crate) fn read_record_past_stray(
    sim: &Sim,
    store: &Store,
    table: TableId,
    key: Key,
    failed: &FailedCoordinatorSet,
) -> Option<Vec<u8>> {
    let bucket = store.bucket_of(table, key).ok()?;
    let primary = store.primary(bucket.partition).ok()?;
    let node = store.mn_node(primary);
    let bytes = sim.read_memory(node, bucket.offset, BUCKET_LEN);
    let (used, _) = parse_bucket(&bytes);
    let slot = used.iter().find(|(_, k)| *k == key.0)?.0;
    let loc = store.item_at(bucket, slot).ok()?;
    let layout = store.table(table).ok()?;
    let item_bytes = sim.read_memory(node, loc.offset, layout.item_len);
    let item = DataItem::new_checked(&item_bytes[..]).ok()?;
    let header = item.header();
    let stray = matches!(
        PillLockWord::from_raw(header.lock_word()).holder(failed),
        Ok(LockHolder::Stray(_))
    );
    let readable = item.is_readable()
        || (stray && header.flags().is_valid() && !header.version().is_invisible());
    readable.then(|| item.value().to_vec())
}

struct Tally {
    committed: Cell<u64>,
    rolled_back: Cell<u64>,
    failed: Cell<u64>,
    attempts: Cell<u64>,
    delta: Cell<i64>,
    latency: RefCell<Histogram<u64>>,
}

fn run_protocol(
    args: &Args,
    workload: &AnyWorkload,
    profile: &NicProfile,
    protocol: &str,
) -> anyhow::Result<Row> {
    let protocol_cfg = protocol_config(protocol)?;
    let (sim, store) = build_cluster(&args.shape(), workload, profile)?;

    let history = Rc::new(RefCell::new(History::new()));
    let tally = Rc::new(Tally {
        committed: Cell::new(0),
        rolled_back: Cell::new(0),
        failed: Cell::new(0),
        attempts: Cell::new(0),
        delta: Cell::new(0),
        latency: RefCell::new(
            Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("static bounds are valid"),
        ),
    });
    let duration: Nanos = args.duration_ms * 1_000_000;
    let warm_up_end = duration / 10;
    let end = warm_up_end + duration;
    let workload = Rc::new(workload.clone());
    let mut id: u16 = 0;
    for cn in 0..args.cns {
        let shared = CnShared::new();
        for thread in 0..args.threads {
            for _ in 0..args.coroutines {
                let ctx = sim.context(sim.cn(cn), thread)?;
                let mut coordinator = FordCoordinator::new(
                    ctx.clone(),
                    Rc::clone(&store),
                    protocol_cfg,
                    id,
                    shared.clone(),
                    Rc::clone(&history),
                )?;
                let mut generator = workload.generator(u32::from(id), args.seed ^ u64::from(id));
                let workload = Rc::clone(&workload);
                let tally = Rc::clone(&tally);
                let clock = ctx.clone();
                sim.spawn(&ctx, async move {
                    while clock.now() < end {
                        let txn = generator.next_txn();
                        let start = clock.now();
                        let executed =
                            execute(&*workload, &mut coordinator, &txn, MAX_ATTEMPTS).await;
                        let done = clock.now();
                        let measured = start >= warm_up_end && done <= end;
                        let attempts = match &executed {
                            Executed::Committed { attempts, .. }
                            | Executed::RolledBack { attempts, .. }
                            | Executed::Failed { attempts, .. } => *attempts,
                        };
                        if let Executed::Committed {
                            outcome: Outcome::Commit { delta },
                            ..
                        } = executed
                        {
                            tally.delta.set(tally.delta.get() + delta);
                        }
                        if !measured {
                            continue;
                        }
                        tally
                            .attempts
                            .set(tally.attempts.get() + u64::from(attempts));
                        match executed {
                            Executed::Committed { .. } => {
                                tally.committed.set(tally.committed.get() + 1);
                                let _ = tally.latency.borrow_mut().record((done - start).max(1));
                            }
                            Executed::RolledBack { .. } => {
                                tally.rolled_back.set(tally.rolled_back.get() + 1);
                            }
                            Executed::Failed { .. } => tally.failed.set(tally.failed.get() + 1),
                        }
                    }
                });
                id += 1;
            }
        }
    }

    let progress = progress_bar(args, protocol, end);
    let mut at_warm_up = None;
    let step = (end / 100).max(1);
    let mut now = 0;
    while now < end {
        now = (now + step).min(end);
        if at_warm_up.is_none() && now >= warm_up_end {
            sim.run_until(warm_up_end);
            at_warm_up = Some(sim.stats());
        }
        sim.run_until(now);
        progress.set_position(now / 1_000);
    }
    let stats = sim.stats();
    let at_warm_up = at_warm_up.unwrap_or_else(|| sim.stats());
    // Let the transactions in flight finish so that the final state is quiescent.
    sim.run_until_idle();
    progress.finish_and_clear();

    let committed = tally.committed.get();
    let per_txn = |kind: OpKind| {
        stats.mn_served_since(&at_warm_up, Some(kind)) as f64 / committed.max(1) as f64
    };
    let measured = duration as f64;
    let mn_busy = stats.mn_busy_fraction_since(&at_warm_up);

    let history = history.borrow();
    let (checker, checked_txns) = if args.no_check {
        ("skipped".to_string(), 0)
    } else {
        let report = check(&history);
        let verdict = match report.anomalies.first() {
            None if report.is_ok() => "ok".to_string(),
            None => format!("{} anomalies", report.total()),
            Some(first) => format!("{} anomalies, first: {first}", report.total()),
        };
        (verdict, history.txns.len())
    };
    let in_doubt = history
        .txns
        .iter()
        .filter(|t| t.outcome == TxnOutcome::Unknown)
        .count();
    let violations = workload.check(
        |table, key| read_record(&sim, &store, table, key),
        tally.delta.get(),
    );
    let invariants = match violations.first() {
        None => "ok".to_string(),
        Some(v) => format!("{} violations, first: {v}", violations.len()),
    };
    if in_doubt > 0 {
        eprintln!("dmem bench: {protocol}: {in_doubt} transactions ended in doubt");
    }
    let latency = tally.latency.borrow();
    let attempts = tally.attempts.get();
    let finished = committed + tally.rolled_back.get() + tally.failed.get();
    Ok(Row {
        protocol: protocol.to_string(),
        workload: args.workload.clone(),
        scale: args.scale.clone(),
        mtps: committed as f64 / measured * 1e3,
        abort_rate: attempts.saturating_sub(finished) as f64 / attempts.max(1) as f64,
        p50_us: latency.value_at_quantile(0.5) as f64 / 1e3,
        p99_us: latency.value_at_quantile(0.99) as f64 / 1e3,
        mn_reads_per_txn: per_txn(OpKind::Read),
        mn_writes_per_txn: per_txn(OpKind::Write),
        mn_cas_per_txn: per_txn(OpKind::Cas),
        mn_faa_per_txn: per_txn(OpKind::Faa),
        mn_nic_busy: mn_busy,
        committed,
        rolled_back: tally.rolled_back.get(),
        failed: tally.failed.get(),
        checker,
        checked_txns,
        invariants,
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

/// Runs the transaction benchmark.
pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let (workload, scale, profile) = args.validate()?;
    let mut rows = Vec::new();
    for protocol in &args.protocol {
        let row = run_protocol(&args, &workload, &profile, protocol)?;
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
            "{:<20} {:>8} {:>7} {:>8} {:>8} {:>6} {:>6} {:>6} {:>6} {:>7}  checker / invariants",
            "protocol",
            "Mtps",
            "aborts",
            "p50 µs",
            "p99 µs",
            "READ",
            "WRITE",
            "CAS",
            "FAA",
            "MN busy"
        );
        for r in &rows {
            println!(
                "{:<20} {:>8.3} {:>6.1}% {:>8.1} {:>8.1} {:>6.2} {:>6.2} {:>6.2} {:>6.2} {:>6.0}%  {} / {}",
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
    Ok(())
}

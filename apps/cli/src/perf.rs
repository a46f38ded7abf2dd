//! `dmem perf`: a perftest-like load generator for one-sided verbs.
//!
//! Every client is a coroutine that posts lists of `--batch` work requests (one doorbell per
//! list) in a closed loop, against its own 64-byte-aligned slots so that atomics do not
//! contend on one address. Throughput counts work requests completed after a 10 % warm-up;
//! latency is from post to completion of a list.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use anyhow::{Context as _, bail, ensure};
use clap::{Args as ClapArgs, ValueEnum};
use dmem_sim::{ClusterConfig, NicProfile, Role, Sim};
use dmem_verbs::{Clock, Nanos, OpKind, PostList, RemoteAddr, Verbs};
use hdrhistogram::Histogram;
use serde::Serialize;

/// Which fabric carries the verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Fabric {
    /// The deterministic simulated cluster (virtual time).
    Sim,
    /// Shared memory on this host (real time): MNs are memfd mappings, each CN thread is an
    /// OS thread running a polling executor.
    Shm,
}

/// The one-sided op to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum PerfOp {
    /// RDMA READ of `--size` bytes.
    Read,
    /// RDMA WRITE of `--size` bytes.
    Write,
    /// 8-byte compare-and-swap.
    Cas,
    /// 8-byte fetch-and-add.
    Faa,
}

impl PerfOp {
    fn kind(self) -> OpKind {
        match self {
            PerfOp::Read => OpKind::Read,
            PerfOp::Write => OpKind::Write,
            PerfOp::Cas => OpKind::Cas,
            PerfOp::Faa => OpKind::Faa,
        }
    }
}

/// Arguments of `dmem perf`.
#[derive(Debug, ClapArgs)]
pub(crate) struct Args {
    /// Fabric to run on.
    #[arg(long, value_enum, default_value = "sim")]
    fabric: Fabric,
    /// NIC profile of the simulated cluster (cx3, cx4, cx5, cx6), or a TOML file with one.
    #[arg(long, default_value = "cx3")]
    profile: String,
    /// Ops to measure, comma-separated (one table row per op and batch size).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "write")]
    op: Vec<PerfOp>,
    /// Bytes per READ or WRITE (atomics are always 8).
    #[arg(long, default_value_t = 8)]
    size: u32,
    /// Work requests per doorbell, comma-separated list.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    batch: Vec<usize>,
    /// Coroutines per CN.
    #[arg(long, default_value_t = 8)]
    clients: u32,
    /// Threads (cores) per CN; clients are spread over them.
    #[arg(long, default_value_t = 4)]
    threads: u16,
    /// Compute nodes.
    #[arg(long, default_value_t = 4)]
    cns: u16,
    /// Memory nodes (clients target them round-robin).
    #[arg(long, default_value_t = 1)]
    mns: u16,
    /// Measured duration per row, ms (virtual on the sim).
    #[arg(long, default_value_t = 2)]
    duration_ms: u64,
    /// Registered memory per MN, MiB (every client needs `--batch` slots of `--size`).
    #[arg(long, default_value_t = 64)]
    mn_memory_mib: u64,
    /// Seed of the simulation.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object per row instead of a table.
    #[arg(long)]
    json: bool,
}

/// One measured row.
#[derive(Debug, Serialize)]
struct Row {
    fabric: &'static str,
    profile: String,
    op: &'static str,
    size: u32,
    batch: usize,
    cns: u16,
    threads: u16,
    clients: u32,
    mns: u16,
    /// Million work requests per second (virtual seconds on the sim).
    mops: f64,
    /// Median latency of a post list, ns.
    p50_ns: u64,
    /// 99th-percentile latency of a post list, ns.
    p99_ns: u64,
    /// Busy fraction of the busiest MN NIC resource (1.0 = saturated); sim only.
    mn_nic_busy: Option<f64>,
    /// Doorbells per work request on the CNs; sim only.
    doorbells_per_wr: Option<f64>,
    /// Simulator speed: work requests simulated (warm-up included) per real second of
    /// this process's run; sim only.
    sim_verbs_per_real_s: Option<f64>,
    /// Real seconds the simulation of this row took; sim only.
    sim_real_s: Option<f64>,
}

impl Args {
    fn validate(&self) -> anyhow::Result<()> {
        ensure!(self.clients > 0, "--clients must be at least 1");
        ensure!(self.threads > 0, "--threads must be at least 1");
        ensure!(self.cns > 0, "--cns must be at least 1");
        ensure!(self.mns > 0, "--mns must be at least 1");
        ensure!(self.duration_ms > 0, "--duration-ms must be at least 1");
        ensure!(
            !self.batch.is_empty() && self.batch.iter().all(|&b| b > 0),
            "--batch sizes must be at least 1"
        );
        ensure!(
            self.batch.iter().all(|&b| b <= 1024),
            "--batch sizes must be at most 1024"
        );
        ensure!(self.size > 0, "--size must be at least 1 byte");
        ensure!(self.mn_memory_mib > 0, "--mn-memory-mib must be at least 1");
        let slot = u64::from(self.size.div_ceil(64) * 64);
        let clients = u64::from(self.cns) * u64::from(self.clients);
        let per_mn = clients.div_ceil(u64::from(self.mns));
        let batch = self.batch.iter().copied().max().unwrap_or(1) as u64;
        let need = per_mn * batch * slot;
        let have = self.mn_memory_mib << 20;
        ensure!(
            need <= have,
            "{per_mn} clients per MN x batch {batch} x {slot}-byte slots need {need} bytes of MN memory but --mn-memory-mib gives {have}: lower --size, --batch or --clients, or raise --mn-memory-mib"
        );
        // Atomics always work on 8-byte words; --size is for the READ and WRITE rows.
        if self.size != 8
            && self
                .op
                .iter()
                .all(|op| matches!(op, PerfOp::Cas | PerfOp::Faa))
        {
            bail!(
                "CAS and FAA work on 8-byte words: use --size 8 (got {})",
                self.size
            );
        }
        Ok(())
    }
}

/// Per-run counters shared by the clients of one executor thread.
struct Tally {
    ops: Cell<u64>,
    latency: RefCell<Histogram<u64>>,
}

impl Tally {
    fn new() -> Rc<Self> {
        Rc::new(Self {
            ops: Cell::new(0),
            latency: RefCell::new(
                Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("static bounds are valid"),
            ),
        })
    }
}

/// One closed-loop client: posts `targets.len()` work requests per doorbell until `end`,
/// counting those that complete after `warm_up_end`.
async fn client<V: Verbs + Clock>(
    ctx: V,
    op: OpKind,
    size: u32,
    targets: Vec<RemoteAddr>,
    warm_up_end: Nanos,
    end: Nanos,
    tally: Rc<Tally>,
) {
    let payload = vec![0xa5u8; size as usize];
    let mut round: u64 = 0;
    while ctx.now() < end {
        let mut list = PostList::with_capacity(targets.len());
        for &addr in &targets {
            match op {
                OpKind::Read => drop(list.read(addr, size)),
                OpKind::Write => drop(list.write(addr, &payload)),
                OpKind::Cas => drop(list.cas(addr, round, round + 1)),
                OpKind::Faa => drop(list.faa(addr, 1)),
            }
        }
        let start = ctx.now();
        if let Err(e) = ctx.post(list).await {
            // Nothing in a perf run is expected to fail; stop this client loudly.
            eprintln!("dmem perf: client stopped: {e}");
            return;
        }
        let done = ctx.now();
        if done >= warm_up_end && done <= end {
            tally.ops.set(tally.ops.get() + targets.len() as u64);
            let _ = tally.latency.borrow_mut().record((done - start).max(1));
        }
        round += 1;
    }
}

fn run_sim(args: &Args, profile: &NicProfile, op: PerfOp, batch: usize) -> anyhow::Result<Row> {
    let slot = u64::from(args.size.div_ceil(64) * 64);
    let memory = args.mn_memory_mib << 20;
    let config = ClusterConfig::with_profile(profile.clone())
        .mns(args.mns)
        .cns(args.cns)
        .threads_per_cn(args.threads)
        .mn_memory_bytes(memory)
        .seed(args.seed);
    let sim = Sim::new(config)?;
    let duration = args.duration_ms * 1_000_000;
    let warm_up_end = duration / 10;
    let end = warm_up_end + duration;
    let tally = Tally::new();
    let mut next_slot = vec![0u64; usize::from(args.mns)];
    for cn in 0..args.cns {
        for c in 0..args.clients {
            let thread = (c % u32::from(args.threads)) as u16;
            let ctx = sim.context(sim.cn(cn), thread)?;
            let global = u64::from(cn) * u64::from(args.clients) + u64::from(c);
            let mn = (global % u64::from(args.mns)) as u16;
            let region = sim.region(sim.mn(mn));
            let first = &mut next_slot[usize::from(mn)];
            let targets = (0..batch as u64)
                .map(|i| {
                    region
                        .at((*first + i) * slot)
                        .context("MN region too small")
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            *first += batch as u64;
            sim.spawn(
                &ctx,
                client(
                    ctx.clone(),
                    op.kind(),
                    args.size,
                    targets,
                    warm_up_end,
                    end,
                    Rc::clone(&tally),
                ),
            );
        }
    }
    let real_start = std::time::Instant::now();
    sim.run_until(warm_up_end);
    let at_warm_up = sim.stats();
    sim.run_until(end);
    let real_s = real_start.elapsed().as_secs_f64();
    let stats = sim.stats();
    let measured = end - warm_up_end;
    let mn_busy = stats.mn_busy_fraction_since(&at_warm_up);
    let (doorbells, wrs) = stats
        .nodes
        .iter()
        .filter(|n| n.role == Role::Compute)
        .fold((0u64, 0u64), |(d, w), n| {
            (d + n.nic.doorbells, w + n.nic.wrs_posted)
        });
    let latency = tally.latency.borrow();
    Ok(Row {
        fabric: "sim",
        profile: profile.name.clone(),
        op: op.kind().name(),
        size: if op.kind().is_atomic() { 8 } else { args.size },
        batch,
        cns: args.cns,
        threads: args.threads,
        clients: args.clients,
        mns: args.mns,
        mops: tally.ops.get() as f64 / measured as f64 * 1e3,
        p50_ns: latency.value_at_quantile(0.5),
        p99_ns: latency.value_at_quantile(0.99),
        mn_nic_busy: Some(mn_busy),
        doorbells_per_wr: Some(doorbells as f64 / wrs.max(1) as f64),
        sim_verbs_per_real_s: Some(stats.total_ops() as f64 / real_s.max(1e-9)),
        sim_real_s: Some(real_s),
    })
}

/// Closed-loop clients on shared memory: one OS thread per CN thread, each running a polling
/// executor with its clients; time is real.
fn run_shm(args: &Args, op: PerfOp, batch: usize) -> anyhow::Result<Row> {
    use dmem_runtime::{Clocked, Executor, monotonic_now};
    use dmem_shm::{ShmFabric, ShmMemoryNode};
    use dmem_verbs::{Endpoint, NodeId, Port, RKey};

    let slot = u64::from(args.size.div_ceil(64) * 64);
    let memory = args.mn_memory_mib << 20;
    let nodes = (0..args.mns)
        .map(|i| {
            ShmMemoryNode::create(NodeId(i), RKey(0x5eed_0000 | u32::from(i)), memory)
                .with_context(|| format!("cannot create the shared-memory region of MN {i}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let fabric = ShmFabric::new();
    // Contexts per (CN, thread), built here so that set-up errors surface before any thread.
    let mut next_slot = vec![0u64; usize::from(args.mns)];
    let mut per_thread: Vec<Vec<(dmem_shm::ShmContext, Vec<RemoteAddr>)>> = Vec::new();
    for cn in 0..args.cns {
        let cn_node = NodeId(args.mns + cn);
        let mut threads: Vec<Vec<_>> = (0..args.threads).map(|_| Vec::new()).collect();
        for c in 0..args.clients {
            let port = Port(u16::try_from(c + 1).context("at most 65534 clients per CN")?);
            let mut ctx = fabric.context(Endpoint {
                node: cn_node,
                port,
            })?;
            for node in &nodes {
                ctx.add_link(node.link(cn_node)?)?;
            }
            let global = u64::from(cn) * u64::from(args.clients) + u64::from(c);
            let mn = (global % u64::from(args.mns)) as usize;
            let region = nodes[mn].region();
            let first = &mut next_slot[mn];
            let targets = (0..batch as u64)
                .map(|i| {
                    region
                        .at((*first + i) * slot)
                        .context("MN region too small")
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            *first += batch as u64;
            threads[(c % u32::from(args.threads)) as usize].push((ctx, targets));
        }
        per_thread.extend(threads);
    }
    let duration = args.duration_ms * 1_000_000;
    // Leave the threads a moment to start before the warm-up begins.
    let start = monotonic_now() + 5_000_000;
    let warm_up_end = start + duration / 10;
    let end = warm_up_end + duration;
    let kind = op.kind();
    let size = args.size;
    let results = std::thread::scope(|scope| {
        let handles: Vec<_> = per_thread
            .into_iter()
            .map(|clients| {
                scope.spawn(move || {
                    let executor = Executor::new();
                    let tally = Tally::new();
                    for (ctx, targets) in clients {
                        let tally = Rc::clone(&tally);
                        executor.spawn(client(
                            Clocked::new(ctx),
                            kind,
                            size,
                            targets,
                            warm_up_end,
                            end,
                            tally,
                        ));
                    }
                    executor.run();
                    let latency = tally.latency.borrow().clone();
                    (tally.ops.get(), latency)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a client thread panicked"))
            })
            .collect::<anyhow::Result<Vec<_>>>()
    })?;
    let mut ops = 0;
    let mut latency =
        Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("static bounds are valid");
    for (n, h) in results {
        ops += n;
        latency.add(&h).context("merging latency histograms")?;
    }
    Ok(Row {
        fabric: "shm",
        profile: "-".into(),
        op: kind.name(),
        size: if kind.is_atomic() { 8 } else { args.size },
        batch,
        cns: args.cns,
        threads: args.threads,
        clients: args.clients,
        mns: args.mns,
        mops: ops as f64 / duration as f64 * 1e3,
        p50_ns: latency.value_at_quantile(0.5),
        p99_ns: latency.value_at_quantile(0.99),
        mn_nic_busy: None,
        doorbells_per_wr: None,
        sim_verbs_per_real_s: None,
        sim_real_s: None,
    })
}

/// Runs `dmem perf`.
pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    args.validate()?;
    let profile = NicProfile::load(&args.profile)?;
    let mut rows = Vec::new();
    for &op in &args.op {
        for &batch in &args.batch {
            let row = match args.fabric {
                Fabric::Sim => run_sim(&args, &profile, op, batch)?,
                Fabric::Shm => run_shm(&args, op, batch)?,
            };
            if args.json {
                println!("{}", serde_json::to_string(&row)?);
            }
            rows.push(row);
        }
    }
    if !args.json {
        print_table(&args, &rows);
    }
    Ok(())
}

fn print_table(args: &Args, rows: &[Row]) {
    let fabric = match args.fabric {
        Fabric::Sim => "sim (virtual time)",
        Fabric::Shm => "shm (real time)",
    };
    let profile = match args.fabric {
        Fabric::Sim => rows.first().map_or("-", |r| r.profile.as_str()),
        Fabric::Shm => "-",
    };
    println!(
        "dmem perf  fabric {fabric}  profile {}  {} MN  {} CN x {} threads x {} clients  {} ms per row  seed {}",
        profile, args.mns, args.cns, args.threads, args.clients, args.duration_ms, args.seed
    );
    println!(
        "{:<6} {:>5} {:>6} {:>9} {:>9} {:>9} {:>8} {:>11}",
        "op", "size", "batch", "Mops", "p50 µs", "p99 µs", "MN busy", "vs batch 1"
    );
    for row in rows {
        let base = rows
            .iter()
            .find(|r| r.op == row.op && r.batch == 1)
            .filter(|b| b.mops > 0.0)
            .map(|b| row.mops / b.mops);
        let busy = row
            .mn_nic_busy
            .map_or("-".to_string(), |b| format!("{:.0}%", b * 100.0));
        println!(
            "{:<6} {:>5} {:>6} {:>9.2} {:>9.2} {:>9.2} {:>8} {:>11}",
            row.op,
            row.size,
            row.batch,
            row.mops,
            row.p50_ns as f64 / 1e3,
            row.p99_ns as f64 / 1e3,
            busy,
            base.map_or("-".to_string(), |g| format!("{g:.2}x")),
        );
    }
    // How fast the simulator itself ran (real time, so it varies with the machine's load).
    for row in rows {
        if let (Some(speed), Some(real_s)) = (row.sim_verbs_per_real_s, row.sim_real_s) {
            println!(
                "simulator: {} batch {}: {:.2} M verbs per real second ({:.3} s real)",
                row.op,
                row.batch,
                speed / 1e6,
                real_s
            );
        }
    }
}

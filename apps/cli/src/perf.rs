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

use dmem_cli::common::{self, Sink, round};

#[cfg(feature = "rdma")]
mod rdma;

/// Most clients (CNs × clients per CN) a simulated row takes. The simulator's cost is linear
/// in clients (see the dmem-sim README); the bound keeps a typo from allocating a row that
/// would look hung.
const MAX_SIM_CLIENTS: u64 = 1 << 16;
/// Most clients on shared memory (one port each per CN).
const MAX_SHM_CLIENTS_PER_CN: u32 = 1024;

/// Most connections a tcp run makes (clients × MNs); each has a completion-reader thread.
const MAX_TCP_CONNECTIONS: u64 = 1024;

/// Which fabric carries the verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Fabric {
    /// The deterministic simulated cluster (virtual time).
    Sim,
    /// Shared memory on this host (real time): MNs are memfd mappings, each CN thread is an
    /// OS thread running a polling executor.
    Shm,
    /// An RDMA NIC of this host through libibverbs, looped back (one CN thread); needs a
    /// build with `--features rdma`.
    Rdma,
    /// TCP over loopback (real time): each MN is a tcp memory node serving from an io_uring
    /// loop in this process, each client context has its own connection to every MN.
    Tcp,
}

/// The one-sided op to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
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
#[derive(Debug, ClapArgs, Serialize)]
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
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=(1 << 20)))]
    size: u32,
    /// Work requests per doorbell, comma-separated list (each 1..=1024).
    #[arg(long, value_delimiter = ',', default_value = "1", value_parser = clap::value_parser!(u64).range(1..=1024))]
    batch: Vec<u64>,
    /// Coroutines per CN (CNs × clients at most 65536 on the sim).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=65536))]
    clients: u32,
    /// Threads (cores) per CN; clients are spread over them.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: u16,
    /// Compute nodes.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=4096))]
    cns: u16,
    /// Memory nodes (clients target them round-robin).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    mns: u16,
    /// Measured duration per row, ms (virtual on the sim).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    duration_ms: u64,
    /// Registered memory per MN, MiB (every client needs `--batch` slots of `--size`;
    /// MNs × this must fit in the machine's available memory).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=(1 << 30)))]
    mn_memory_mib: u64,
    /// Seed of the simulation.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print JSON lines instead of a table: one object per row, then a summary.
    #[arg(long)]
    json: bool,
    /// Also write the rows to this CSV file.
    #[arg(long, value_name = "FILE")]
    csv: Option<std::path::PathBuf>,
    /// tcp only: measure against memory nodes already serving at these addresses (MN i at
    /// the i-th; `--mns` must equal their number), e.g. a `dmem perf --serve` in another
    /// network namespace or on another host, instead of starting them in this process.
    #[arg(long, value_delimiter = ',', value_name = "IP:PORT")]
    servers: Vec<std::net::SocketAddr>,
    /// tcp only: measure nothing; serve `--mns` memory nodes of `--mn-memory-mib` each
    /// (MN i on the i-th address) for a `dmem perf --servers` until this process is killed.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "IP:PORT",
        conflicts_with = "servers"
    )]
    serve: Vec<std::net::SocketAddr>,
}

/// One measured row.
#[derive(Debug, Serialize)]
struct Row {
    fabric: &'static str,
    profile: String,
    op: &'static str,
    size: u32,
    batch: u64,
    cns: u16,
    threads: u16,
    clients: u32,
    mns: u16,
    seed: u64,
    duration_ms: u64,
    /// Million work requests per second (virtual seconds on the sim; on the sim, those the
    /// MNs served inside the measured window, so a backlog from the warm-up is not counted).
    mops: f64,
    /// Work requests per second, unrounded, on real fabrics (a soft-RoCE NIC's thousands
    /// round to 0.00 Mops); absent on the simulator.
    #[serde(skip_serializing_if = "Option::is_none")]
    ops_per_s: Option<f64>,
    /// Median latency of a post list, ns.
    p50_ns: u64,
    /// 99th-percentile latency of a post list, ns.
    p99_ns: u64,
    /// Median latency of a post list, µs.
    p50_us: f64,
    /// 99th-percentile latency of a post list, µs.
    p99_us: f64,
    /// Busy fraction of the busiest MN NIC resource (1.0 = saturated); sim only.
    mn_nic_busy: Option<f64>,
    /// Doorbells per work request on the CNs; sim only.
    doorbells_per_wr: Option<f64>,
    /// Simulator speed: work requests simulated (warm-up included) per real second of
    /// this process's run; sim only.
    sim_verbs_per_real_s: Option<f64>,
    /// Real seconds the simulation of this row took; sim only.
    sim_real_s: Option<f64>,
    /// CPU time the CN side spent per work request completed in the measured window, ns:
    /// every thread of this process but the tcp memory nodes' serving threads (client
    /// executors, tcp completion readers); real-time fabrics only, where the kernel
    /// reports per-thread CPU time.
    cn_cpu_ns_per_wr: Option<f64>,
}

impl Args {
    fn validate(&self) -> anyhow::Result<()> {
        common::no_duplicates(
            "op",
            &self.op.iter().map(|o| o.kind().name()).collect::<Vec<_>>(),
        )?;
        common::no_duplicates("batch", &self.batch)?;
        for (flag, addrs) in [("servers", &self.servers), ("serve", &self.serve)] {
            if addrs.is_empty() {
                continue;
            }
            ensure!(
                self.fabric == Fabric::Tcp,
                "--{flag} is for the tcp fabric: add --fabric tcp"
            );
            ensure!(
                addrs.len() == usize::from(self.mns),
                "--{flag} names {} memory nodes but --mns is {}: give --mns {}",
                addrs.len(),
                self.mns,
                addrs.len()
            );
            common::no_duplicates(flag, addrs)?;
        }
        let slot = u64::from(self.size.div_ceil(64) * 64);
        let clients = u64::from(self.cns) * u64::from(self.clients);
        match self.fabric {
            Fabric::Sim => ensure!(
                clients <= MAX_SIM_CLIENTS,
                "{clients} clients: the simulator takes at most {MAX_SIM_CLIENTS}: lower --clients or --cns"
            ),
            Fabric::Shm => ensure!(
                self.clients <= MAX_SHM_CLIENTS_PER_CN,
                "--clients {}: shared memory takes at most {MAX_SHM_CLIENTS_PER_CN} per CN",
                self.clients
            ),
            Fabric::Rdma => ensure!(
                cfg!(feature = "rdma"),
                "this dmem was built without RDMA support: build it with `cargo build --release -p dmem-cli --features rdma`"
            ),
            Fabric::Tcp => ensure!(
                clients * u64::from(self.mns) <= MAX_TCP_CONNECTIONS,
                "{clients} clients x {} MNs: the tcp fabric takes at most {MAX_TCP_CONNECTIONS} connections (each has a completion-reader thread): lower --clients, --cns or --mns",
                self.mns
            ),
        }
        let per_mn = clients.div_ceil(u64::from(self.mns));
        let batch = self.batch.iter().copied().max().unwrap_or(1);
        let need = per_mn * batch * slot;
        let have = self.mn_memory_mib << 20;
        ensure!(
            need <= have,
            "{per_mn} clients per MN x batch {batch} x {slot}-byte slots need {need} bytes of MN memory but --mn-memory-mib gives {have}: lower --size, --batch or --clients, or raise --mn-memory-mib"
        );
        common::ensure_memory(
            common::product(&[u64::from(self.mns), self.mn_memory_mib, 1 << 20]),
            &format!("{} MNs x --mn-memory-mib {}", self.mns, self.mn_memory_mib),
            "--mn-memory-mib or --mns",
        )?;
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
    /// A latency seen again and again and how many times, not yet in `latency`: the
    /// closed-loop clients of the deterministic simulator see one latency over and over, and
    /// a compare and an increment cost less than a histogram update (≈60 instructions).
    /// Recording is commutative, so the histogram comes out as if every value had been
    /// recorded on its own.
    repeats: Cell<(u64, u64)>,
}

impl Tally {
    fn new() -> Rc<Self> {
        Rc::new(Self {
            ops: Cell::new(0),
            latency: RefCell::new(
                Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("static bounds are valid"),
            ),
            repeats: Cell::new((0, 0)),
        })
    }

    /// Records one latency (values beyond the histogram's bound are dropped, as
    /// `Histogram::record` drops them).
    fn record(&self, value: u64) {
        let (last, count) = self.repeats.get();
        if last == value {
            self.repeats.set((last, count + 1));
        } else {
            self.flush();
            self.repeats.set((value, 1));
        }
    }

    fn flush(&self) {
        let (value, count) = self.repeats.replace((0, 0));
        if count > 0 {
            let _ = self.latency.borrow_mut().record_n(value, count);
        }
    }

    /// Every latency recorded so far.
    fn latency(&self) -> std::cell::Ref<'_, Histogram<u64>> {
        self.flush();
        self.latency.borrow()
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
    // The end of a round is the next round's loop check (nothing happens in between).
    let mut now = ctx.now();
    while now < end {
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
            tally.record((done - start).max(1));
        }
        round += 1;
        now = done;
    }
}

fn run_sim(args: &Args, profile: &NicProfile, op: PerfOp, batch: u64) -> anyhow::Result<Row> {
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
            let targets = (0..batch)
                .map(|i| {
                    region
                        .at((*first + i) * slot)
                        .context("MN region too small")
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            *first += batch;
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
    let latency = tally.latency();
    let served = stats.mn_served_since(&at_warm_up, None);
    ensure!(
        tally.ops.get() > 0 && served > 0,
        "no work request completed in the measured window ({} ms): the lists take longer than it (a slow profile or many clients); raise --duration-ms or lower --clients",
        args.duration_ms
    );
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
        seed: args.seed,
        duration_ms: args.duration_ms,
        mops: round(served as f64 / measured as f64 * 1e3, 3),
        ops_per_s: None,
        p50_ns: latency.value_at_quantile(0.5),
        p99_ns: latency.value_at_quantile(0.99),
        p50_us: round(latency.value_at_quantile(0.5) as f64 / 1e3, 2),
        p99_us: round(latency.value_at_quantile(0.99) as f64 / 1e3, 2),
        mn_nic_busy: Some(round(mn_busy, 3)),
        doorbells_per_wr: Some(round(doorbells as f64 / wrs.max(1) as f64, 3)),
        sim_verbs_per_real_s: Some(round(stats.total_ops() as f64 / real_s.max(1e-9), 0)),
        sim_real_s: Some(round(real_s, 3)),
        cn_cpu_ns_per_wr: None,
    })
}

/// The clients of each executor thread: a context and the addresses it targets.
type ThreadClients<V> = Vec<Vec<(V, Vec<RemoteAddr>)>>;

/// `batch` consecutive slots of `slot` bytes for client `global`, on the MN it targets
/// (round-robin), taken from that MN's next free slot.
fn client_targets(
    args: &Args,
    global: u64,
    batch: u64,
    regions: &[dmem_verbs::MemoryRegion],
    next_slot: &mut [u64],
) -> anyhow::Result<Vec<RemoteAddr>> {
    let slot = u64::from(args.size.div_ceil(64) * 64);
    let mn = (global % u64::from(args.mns)) as usize;
    let first = &mut next_slot[mn];
    let targets = (0..batch)
        .map(|i| {
            regions[mn]
                .at((*first + i) * slot)
                .context("MN region too small")
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    *first += batch;
    Ok(targets)
}

/// The memory nodes of a real-time run: one zeroed shared-memory region each.
fn memory_nodes(args: &Args) -> anyhow::Result<Vec<dmem_shm::ShmMemoryNode>> {
    use dmem_verbs::{NodeId, RKey};
    let memory = args.mn_memory_mib << 20;
    (0..args.mns)
        .map(|i| {
            dmem_shm::ShmMemoryNode::create(NodeId(i), RKey(0x5eed_0000 | u32::from(i)), memory)
                .with_context(|| format!("cannot create the shared-memory region of MN {i}"))
        })
        .collect()
}

/// Closed-loop clients on shared memory: one OS thread per CN thread, each running a polling
/// executor with its clients; time is real.
fn run_shm(args: &Args, op: PerfOp, batch: u64) -> anyhow::Result<Row> {
    use dmem_shm::ShmFabric;
    use dmem_verbs::{Endpoint, NodeId, Port};

    let nodes = memory_nodes(args)?;
    let regions: Vec<_> = nodes.iter().map(|n| n.region()).collect();
    let fabric = ShmFabric::new();
    // Contexts per (CN, thread), built here so that set-up errors surface before any thread.
    let mut next_slot = vec![0u64; usize::from(args.mns)];
    let mut per_thread: ThreadClients<dmem_shm::ShmContext> = Vec::new();
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
            let targets = client_targets(args, global, batch, &regions, &mut next_slot)?;
            threads[(c % u32::from(args.threads)) as usize].push((ctx, targets));
        }
        per_thread.extend(threads);
    }
    run_real_time(args, "shm", op, batch, per_thread)
}

/// Closed-loop clients on the tcp fabric: against the memory nodes at `--servers`, or else
/// over loopback against `TcpMemoryServer`s (their io_uring serving threads) started in this
/// process; every client context has its own connection to each MN; threads as on shm.
fn run_tcp(args: &Args, op: PerfOp, batch: u64) -> anyhow::Result<Row> {
    use dmem_tcp::{TcpFabric, TcpMemoryServer};
    use dmem_verbs::{NodeId, Port};

    let servers = if args.servers.is_empty() {
        memory_nodes(args)?
            .into_iter()
            .map(|mn| {
                TcpMemoryServer::serve(mn, std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
                    .context("cannot start a tcp memory node on loopback")
            })
            .collect::<anyhow::Result<Vec<_>>>()?
    } else {
        Vec::new()
    };
    let addrs: Vec<_> = if args.servers.is_empty() {
        servers.iter().map(TcpMemoryServer::local_addr).collect()
    } else {
        args.servers.clone()
    };
    let mut next_slot = vec![0u64; usize::from(args.mns)];
    let mut per_thread: ThreadClients<dmem_tcp::TcpContext> = Vec::new();
    for cn in 0..args.cns {
        let fabric = TcpFabric::new(NodeId(args.mns + cn));
        let mut threads: Vec<Vec<_>> = (0..args.threads).map(|_| Vec::new()).collect();
        for c in 0..args.clients {
            let port = Port(u16::try_from(c + 1).context("at most 65534 clients per CN")?);
            let mut ctx = fabric.context(port)?;
            let regions = addrs
                .iter()
                .map(|&addr| {
                    ctx.connect(addr)
                        .with_context(|| format!("cannot reach the tcp memory node at {addr}"))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let global = u64::from(cn) * u64::from(args.clients) + u64::from(c);
            let targets = client_targets(args, global, batch, &regions, &mut next_slot)?;
            threads[(c % u32::from(args.threads)) as usize].push((ctx, targets));
        }
        per_thread.extend(threads);
    }
    let row = run_real_time(args, "tcp", op, batch, per_thread);
    for server in servers {
        server.stop().context("a tcp memory node failed")?;
    }
    row
}

/// `dmem perf --serve`: the memory nodes of a `--servers` run, each a `TcpMemoryServer` on
/// its address, serving until the process is killed. Prints one line per MN once it serves.
fn serve(args: &Args) -> anyhow::Result<()> {
    use std::io::Write as _;
    let servers = memory_nodes(args)?
        .into_iter()
        .zip(&args.serve)
        .map(|(mn, &addr)| {
            dmem_tcp::TcpMemoryServer::serve(mn, addr)
                .with_context(|| format!("cannot serve a tcp memory node on {addr}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut out = std::io::stdout().lock();
    for (i, server) in servers.iter().enumerate() {
        writeln!(
            out,
            "dmem perf: MN {i} serves {} MiB on {}",
            args.mn_memory_mib,
            server.local_addr()
        )?;
    }
    out.flush()?;
    drop(out);
    loop {
        std::thread::park();
    }
}

/// Name of the thread that samples CPU time (excluded from what it samples).
const CPU_SAMPLER: &str = "dmem-perf-cpu";

/// CPU time (ns) the CN side of this process has used so far: the process's CPU time less
/// that of the tcp memory nodes' serving threads (`dmem-tcp-mn*`) and the sampler, listed
/// from `/proc/self/task`. Those live through the measured window, so the difference of two
/// samples counts every CN-side thread, one that exited in between too (a sum over the live
/// CN threads lost an exited thread's whole time and could go down: 0 ns per work request in
/// a CI run). `None` without `/proc` or CPU clocks.
fn cn_cpu_ns() -> Option<u64> {
    let process = process_cpu_ns()?;
    let mut excluded = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path();
        let Some(tid) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        // A thread that exited between the listing and the reads is not one of these.
        let Ok(name) = std::fs::read_to_string(path.join("comm")) else {
            continue;
        };
        let name = name.trim_end();
        if name.starts_with("dmem-tcp-mn") || name == CPU_SAMPLER {
            excluded += thread_cpu_ns(tid).unwrap_or(0);
        }
    }
    Some(process.saturating_sub(excluded))
}

/// CPU time of this process, every thread that ever ran in it included, ns.
fn process_cpu_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &raw mut ts) };
    (rc == 0).then(|| timespec_ns(&ts))
}

fn timespec_ns(ts: &libc::timespec) -> u64 {
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// CPU time of thread `tid` of this process, ns, from its CPU-time clock: Linux's
/// `MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)`, the id `pthread_getcpuclockid` returns. Exact
/// even while the thread runs on another core (`/proc/…/schedstat` lags a running thread
/// until its next tick or switch). `None` once the thread has exited.
fn thread_cpu_ns(tid: i32) -> Option<u64> {
    const CPUCLOCK_PERTHREAD: libc::clockid_t = 4;
    const CPUCLOCK_SCHED: libc::clockid_t = 2;
    let clock = ((!tid) << 3) | CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call; an invalid
    // clock id (a thread gone) is reported as an error return, not undefined behaviour.
    let rc = unsafe { libc::clock_gettime(clock, &raw mut ts) };
    (rc == 0).then(|| timespec_ns(&ts))
}

/// Samples [`cn_cpu_ns`] at `from` and at `to` (monotonic instants) on its own thread; the
/// handle yields the CPU time the CN side used in between.
pub(crate) fn sample_cn_cpu(
    from: Nanos,
    to: Nanos,
) -> anyhow::Result<std::thread::JoinHandle<Option<u64>>> {
    fn sleep_until(at: Nanos) {
        let now = dmem_runtime::monotonic_now();
        if at > now {
            std::thread::sleep(std::time::Duration::from_nanos(at - now));
        }
    }
    std::thread::Builder::new()
        .name(CPU_SAMPLER.into())
        .spawn(move || {
            sleep_until(from);
            let start = cn_cpu_ns()?;
            sleep_until(to);
            Some(cn_cpu_ns()?.saturating_sub(start))
        })
        .context("cannot spawn the CPU sampler thread")
}

/// Runs the clients of each thread on its own polling executor for the measured window.
fn run_real_time<V: Verbs + Send + 'static>(
    args: &Args,
    fabric: &'static str,
    op: PerfOp,
    batch: u64,
    per_thread: ThreadClients<V>,
) -> anyhow::Result<Row> {
    use dmem_runtime::{Clocked, Executor, monotonic_now};

    let duration = args.duration_ms * 1_000_000;
    let kind = op.kind();
    let size = args.size;
    // The window starts once every client thread runs (a busy machine may start them late):
    // all threads meet at a barrier, the window is fixed, and they meet again to read it.
    let threads = per_thread.len();
    let ready = std::sync::Barrier::new(threads + 1);
    // Client threads stay until the CPU sampler has read them at the window's end (an exited
    // thread's CPU time can no longer be read).
    let sampled = std::sync::Barrier::new(threads + 1);
    let window = std::sync::OnceLock::<(Nanos, Nanos)>::new();
    let results = std::thread::scope(|scope| {
        let handles: Vec<_> = per_thread
            .into_iter()
            .map(|clients| {
                let (ready, sampled, window) = (&ready, &sampled, &window);
                scope.spawn(move || {
                    let executor = Executor::new();
                    let tally = Tally::new();
                    ready.wait();
                    ready.wait();
                    let (warm_up_end, end) = *window.get().expect("set between the barriers");
                    // Waits for the sampler when this thread ends, panicking or not.
                    let _stay = WaitOnDrop(sampled);
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
                    let latency = tally.latency().clone();
                    (tally.ops.get(), latency)
                })
            })
            .collect();
        ready.wait();
        let start = monotonic_now() + 1_000_000;
        let warm_up_end = start + duration / 10;
        let _ = window.set((warm_up_end, warm_up_end + duration));
        // Spawned before the barrier releases the clients, but its error only after: a
        // client thread must never be left waiting at the barrier.
        let cpu = sample_cn_cpu(warm_up_end, warm_up_end + duration);
        ready.wait();
        let cpu = cpu.map(|sampler| sampler.join());
        sampled.wait();
        let cpu = cpu?.map_err(|_| anyhow::anyhow!("the CPU sampler panicked"))?;
        let results = handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a client thread panicked"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        anyhow::Ok((results, cpu))
    })?;
    let (results, cpu_ns) = results;
    let (ops, latency) = merge(results)?;
    ensure!(
        ops > 0,
        "no work request completed in the measured window ({} ms of real time): the client threads did not get to run in it (a busy machine?); raise --duration-ms",
        args.duration_ms
    );
    Ok(Row::real_time(
        args,
        fabric,
        "-".into(),
        kind,
        batch,
        ops,
        duration,
        &latency,
        cpu_ns,
    ))
}

/// Waits at a barrier when dropped.
struct WaitOnDrop<'a>(&'a std::sync::Barrier);

impl Drop for WaitOnDrop<'_> {
    fn drop(&mut self) {
        self.0.wait();
    }
}

impl Row {
    /// A row measured in real time (shm, tcp, rdma): `ops` work requests completed in the
    /// `duration_ns` window, their latencies in `latency`, `cn_cpu_ns` the CPU time the CN
    /// side used in that window (see [`sample_cn_cpu`]); no simulator figures.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn real_time(
        args: &Args,
        fabric: &'static str,
        profile: String,
        kind: OpKind,
        batch: u64,
        ops: u64,
        duration_ns: u64,
        latency: &Histogram<u64>,
        cn_cpu_ns: Option<u64>,
    ) -> Self {
        Row {
            fabric,
            profile,
            op: kind.name(),
            size: if kind.is_atomic() { 8 } else { args.size },
            batch,
            cns: args.cns,
            threads: args.threads,
            clients: args.clients,
            mns: args.mns,
            seed: args.seed,
            duration_ms: args.duration_ms,
            mops: round(ops as f64 / duration_ns as f64 * 1e3, 3),
            ops_per_s: Some(round(ops as f64 / duration_ns as f64 * 1e9, 1)),
            p50_ns: latency.value_at_quantile(0.5),
            p99_ns: latency.value_at_quantile(0.99),
            p50_us: round(latency.value_at_quantile(0.5) as f64 / 1e3, 2),
            p99_us: round(latency.value_at_quantile(0.99) as f64 / 1e3, 2),
            mn_nic_busy: None,
            doorbells_per_wr: None,
            sim_verbs_per_real_s: None,
            sim_real_s: None,
            cn_cpu_ns_per_wr: cn_cpu_ns.map(|cpu| round(cpu as f64 / ops.max(1) as f64, 1)),
        }
    }
}

type ThreadResult = (u64, Histogram<u64>);

fn merge(results: Vec<ThreadResult>) -> anyhow::Result<ThreadResult> {
    let mut ops = 0;
    let mut latency =
        Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("static bounds are valid");
    for (n, h) in results {
        ops += n;
        latency.add(&h).context("merging latency histograms")?;
    }
    Ok((ops, latency))
}

/// Runs `dmem perf`.
pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    args.validate()?;
    if !args.serve.is_empty() {
        return serve(&args);
    }
    let profile = common::load_profile(&args.profile)?;
    let mut sink = Sink::new(args.json, args.csv.as_deref())?;
    let rows_total = (args.op.len() * args.batch.len()) as u64;
    let bar = common::progress(rows_total, "dmem perf", "rows", args.json);
    let mut rows = Vec::new();
    for &op in &args.op {
        for &batch in &args.batch {
            let row = match args.fabric {
                Fabric::Sim => run_sim(&args, &profile, op, batch)?,
                Fabric::Shm => run_shm(&args, op, batch)?,
                #[cfg(feature = "rdma")]
                Fabric::Rdma => rdma::run_rdma(&args, op, batch)?,
                #[cfg(not(feature = "rdma"))]
                Fabric::Rdma => unreachable!("refused by validate without the rdma feature"),
                Fabric::Tcp => run_tcp(&args, op, batch)?,
            };
            sink.row(&row)?;
            bar.inc(1);
            rows.push(row);
        }
    }
    bar.finish_and_clear();
    if !args.json {
        print_table(&args, &rows);
    }
    sink.finish("perf", &args, serde_json::json!({}))
}

fn print_table(args: &Args, rows: &[Row]) {
    let fabric = match args.fabric {
        Fabric::Sim => "sim (virtual time)".to_string(),
        Fabric::Shm => "shm (real time)".to_string(),
        Fabric::Rdma => "rdma (real time)".to_string(),
        Fabric::Tcp if args.servers.is_empty() => "tcp over loopback (real time)".to_string(),
        Fabric::Tcp => format!(
            "tcp to {} (real time)",
            args.servers
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ),
    };
    let profile = match args.fabric {
        Fabric::Sim => rows.first().map_or("-", |r| r.profile.as_str()),
        Fabric::Shm | Fabric::Rdma | Fabric::Tcp => "-",
    };
    println!(
        "dmem perf  fabric {fabric}  profile {}  {} MN  {} CN x {} threads x {} clients  {} ms per row  seed {}",
        profile, args.mns, args.cns, args.threads, args.clients, args.duration_ms, args.seed
    );
    let mut t = common::table(&[
        "op",
        "size",
        "batch",
        "Mops",
        "p50 µs",
        "p99 µs",
        "MN busy",
        "vs batch 1",
        "CN CPU ns/WR",
    ]);
    for row in rows {
        let base = rows
            .iter()
            .find(|r| r.op == row.op && r.batch == 1)
            .filter(|b| b.mops > 0.0)
            .map(|b| row.mops / b.mops);
        t.add_row(vec![
            row.op.to_string(),
            row.size.to_string(),
            row.batch.to_string(),
            format!("{:.2}", row.mops),
            format!("{:.2}", row.p50_us),
            format!("{:.2}", row.p99_us),
            row.mn_nic_busy
                .map_or("-".to_string(), |b| format!("{:.0}%", b * 100.0)),
            base.map_or("-".to_string(), |g| format!("{g:.2}x")),
            row.cn_cpu_ns_per_wr
                .map_or("-".to_string(), |c| format!("{c:.0}")),
        ]);
    }
    println!("{}", common::render(&t));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Counting repeated latencies gives the histogram of recording each one, out-of-range
    /// values (dropped by both) included.
    #[test]
    fn tally_equals_recording_each_latency() {
        let tally = Tally::new();
        let mut each =
            Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("static bounds");
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for i in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let value = match (x >> 8) % 8 {
                0 => 1 + (x >> 20) % 1_000_000,
                1 => 100_000_000_000,
                _ => 1740 + i / 3_000,
            };
            tally.record(value);
            let _ = each.record(value);
        }
        let counted = tally.latency().clone();
        assert_eq!(counted, each);
        assert_eq!(counted.len(), each.len());
        assert_eq!(
            counted.value_at_quantile(0.99),
            each.value_at_quantile(0.99)
        );
        // Reading twice changes nothing.
        assert_eq!(*tally.latency(), each);
    }
}

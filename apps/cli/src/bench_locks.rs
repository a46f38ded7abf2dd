//! `dmem bench locks`: DecLock's lock microbenchmark (§6.1) on the simulated cluster.
//!
//! Every client (a coroutine; `--clients` per CN) loops: pick a lock by a Zipfian
//! distribution over `--locks`, acquire it shared with probability `--read-ratio`
//! (exclusive otherwise), READ (shared) or WRITE (exclusive) the 64-byte object it protects
//! on the MN, spend `--cs-ns` inside, release. Throughput and latency count operations
//! finishing after a 10 % warm-up; lock counters are the clients' own (MN operations they
//! sent for locking, retries), NIC figures come from the simulator.
//!
//! Zipf: the workloads' sampler (`rand_distr::Zipf` through
//! [`dmem_workloads::dist::KeyChooser`], unscrambled): O(1) setup and per draw, so set-up
//! does not grow with `--locks`; deterministic from the seed, and lock 0 is the hottest,
//! which the fairness figure needs to find.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use anyhow::{Context as _, bail, ensure};
use clap::{Args as ClapArgs, ValueEnum};
use dmem_cli::common::{self, Sink, round};
use dmem_locks::caslock::{CasLockClient, CasLockConfig};
use dmem_locks::declock::{DecLockClient, DecLockConfig};
use dmem_locks::dslr::{DslrClient, DslrConfig};
use dmem_locks::local::{FairnessPolicy, LocalLockTable};
use dmem_locks::shiftlock::{ShiftLockClient, ShiftLockConfig};
use dmem_locks::{
    Directory, LockLayout, LockMode, LockStats, NoFailures, RemoteAddr, RwLockClient,
};
use dmem_sim::{ClusterConfig, NicProfile, Sim, SimContext};
use dmem_verbs::{Clock, Nanos, Verbs, VerbsExt};
use dmem_workloads::dist::{KeyChooser, KeyDistribution, WorkloadRng, rng_for};
use hdrhistogram::Histogram;
use rand::RngExt as _;
use serde::Serialize;

/// Most clients in total (CNs × clients per CN): the simulator's cost grows faster than
/// linearly with outstanding requests at one MN (see `dmem perf`), and DecLock's flat queue
/// holds at most 1024 entries.
const MAX_CLIENTS: u64 = 4096;

/// Bytes of the object each lock protects.
const OBJECT_BYTES: u32 = 64;

/// A lock protocol to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum LockArg {
    /// Reader-writer CAS spinlock (FORD/Sherman style), no backoff.
    Caslock,
    /// DSLR+: reader-writer ticket lock with truncated exponential backoff.
    Dslr,
    /// ShiftLock-style MCS reader-writer lock (writer hand-over, counted readers).
    Shiftlock,
    /// DecLock with §5 hierarchical locking (CN-level CQL queue, per-CN local locks),
    /// task-fair.
    DeclockTf,
    /// DecLock with §5 hierarchical locking, phase-fair.
    DeclockPf,
    /// DecLock §4 alone: a client-level CQL queue (one entry per client), strict FIFO.
    DeclockFlat,
    /// caslock, dslr, shiftlock, declock-tf, declock-pf.
    All,
}

impl LockArg {
    fn name(self) -> &'static str {
        match self {
            LockArg::Caslock => "caslock",
            LockArg::Dslr => "dslr",
            LockArg::Shiftlock => "shiftlock",
            LockArg::DeclockTf => "declock-tf",
            LockArg::DeclockPf => "declock-pf",
            LockArg::DeclockFlat => "declock-flat",
            LockArg::All => "all",
        }
    }
}

/// Arguments of `dmem bench locks`.
#[derive(Debug, ClapArgs, Serialize)]
pub(crate) struct Args {
    /// Locks to measure, comma-separated (caslock, dslr, shiftlock, declock-tf,
    /// declock-pf, declock-flat, all).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "all")]
    lock: Vec<LockArg>,
    /// Compute nodes (CNs × clients at most 4096).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=4096))]
    cns: u16,
    /// Clients (coroutines) per CN.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    clients: u32,
    /// Cores per CN; clients are spread over them.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: u16,
    /// Number of locks (each protects one object; MN memory is checked against the
    /// machine's before set-up).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=(1 << 40)))]
    locks: u64,
    /// Zipfian skew θ of lock choice (0 = uniform).
    #[arg(long, default_value_t = 0.99)]
    zipf: f64,
    /// Probability that an operation is a read (shared lock).
    #[arg(long, default_value_t = 0.5)]
    read_ratio: f64,
    /// Critical section after the object access, ns of virtual time.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1_000_000_000))]
    cs_ns: u64,
    /// NIC profile (cx3, cx4, cx5, cx6) or a TOML file with one.
    #[arg(long, default_value = "cx4")]
    profile: String,
    /// Measured duration per lock, ms of virtual time (plus 10 % warm-up).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    duration_ms: u64,
    /// Seed of the simulation and the workload.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print JSON lines instead of a table: one object per lock, then a summary.
    #[arg(long)]
    json: bool,
    /// Also write the rows to this CSV file.
    #[arg(long, value_name = "FILE")]
    csv: Option<std::path::PathBuf>,
}

impl Args {
    fn validate(&self) -> anyhow::Result<Vec<LockArg>> {
        common::no_duplicates(
            "lock",
            &self.lock.iter().map(|l| l.name()).collect::<Vec<_>>(),
        )?;
        ensure!(
            self.zipf.is_finite() && self.zipf >= 0.0,
            "--zipf must be a finite number >= 0 (got {})",
            self.zipf
        );
        ensure!(
            (0.0..=1.0).contains(&self.read_ratio),
            "--read-ratio must be within [0, 1] (got {})",
            self.read_ratio
        );
        let total = u64::from(self.cns) * u64::from(self.clients);
        ensure!(
            total <= MAX_CLIENTS,
            "{total} clients: at most {MAX_CLIENTS} in total (the simulator's cost grows faster than linearly with requests outstanding at the MN, and DecLock's flat queue holds 1024): lower --cns or --clients"
        );
        let mut locks = Vec::new();
        for &l in &self.lock {
            match l {
                LockArg::All => locks.extend([
                    LockArg::Caslock,
                    LockArg::Dslr,
                    LockArg::Shiftlock,
                    LockArg::DeclockTf,
                    LockArg::DeclockPf,
                ]),
                other => locks.push(other),
            }
        }
        locks.dedup();
        // MN region (object + the largest lock word of the run) plus two addresses per lock
        // on the CN side, for every lock, before any is laid out.
        let mut stride = 8u64;
        for &l in &locks {
            let (_, layout) = lock_layout(self, l)?;
            stride = stride.max(layout.bytes.div_ceil(8) * 8);
        }
        let per_lock = u64::from(OBJECT_BYTES) + stride + 2 * 16;
        common::ensure_memory(
            common::product(&[self.locks, per_lock]),
            &format!("--locks {} ({per_lock} bytes each)", self.locks),
            "--locks",
        )?;
        Ok(locks)
    }
}

/// The CQL capacity of a DecLock run: CNs (§5) or clients (§4, flat), at least 8.
fn cql_capacity(args: &Args, which: LockArg) -> usize {
    let total = u64::from(args.cns) * u64::from(args.clients);
    match which {
        LockArg::DeclockFlat => (total.next_power_of_two() as usize).max(8),
        _ => (usize::from(args.cns).next_power_of_two()).max(8),
    }
}

fn lock_layout(args: &Args, which: LockArg) -> anyhow::Result<(Which, LockLayout)> {
    let capacity = cql_capacity(args, which);
    Ok(match which {
        LockArg::Caslock => (Which::Cas, dmem_locks::caslock::layout()),
        LockArg::Dslr => (Which::Dslr, dmem_locks::dslr::layout()),
        LockArg::Shiftlock => (Which::Shift, dmem_locks::shiftlock::layout()),
        LockArg::DeclockTf => (
            Which::Dec(Some(FairnessPolicy::TaskFair)),
            cql_layout(capacity)?,
        ),
        LockArg::DeclockPf => (
            Which::Dec(Some(FairnessPolicy::PhaseFair)),
            cql_layout(capacity)?,
        ),
        LockArg::DeclockFlat => (Which::Dec(None), cql_layout(capacity)?),
        LockArg::All => bail!("`all` is expanded before the locks are laid out"),
    })
}

/// One measured row.
#[derive(Debug, Serialize)]
struct Row {
    lock: &'static str,
    profile: String,
    seed: u64,
    duration_ms: u64,
    cns: u16,
    clients_per_cn: u32,
    total_clients: u64,
    locks: u64,
    zipf: f64,
    read_ratio: f64,
    cs_ns: u64,
    /// Million operations (lock + object access + unlock) per virtual second.
    mops: f64,
    /// Median operation latency, ns.
    p50_ns: u64,
    /// 99th-percentile operation latency, ns.
    p99_ns: u64,
    /// Median operation latency, µs.
    p50_us: f64,
    /// 99th-percentile operation latency, µs.
    p99_us: f64,
    /// MN operations the clients sent to acquire, per acquisition.
    mn_ops_per_acquire: f64,
    /// MN operations sent for locking (acquire + release), per operation.
    lock_mn_ops_per_op: f64,
    /// All MN operations served (locks + objects), per operation.
    mn_ops_per_op: f64,
    /// Retries per acquisition (mean).
    retries_per_acquire: f64,
    /// 99th percentile and most retries of one acquisition.
    retries_p99: u64,
    retries_max: u64,
    /// MN atomics (CAS + FAA) served per second of virtual time, millions.
    mn_atomic_mops: f64,
    /// Busy fraction of the busiest MN NIC resource.
    mn_nic_busy: f64,
    /// p99 / median acquire latency on the hottest lock.
    fairness_hot: f64,
    /// DecLock: queue capacity used (0 for other locks).
    cql_capacity: usize,
    /// DecLock: refetches per release, resets.
    refetches_per_release: f64,
    resets: u64,
    /// DecLock §5: fraction of acquisitions served by the local lock without a CQL
    /// acquisition; remote-timestamp prefetch READs per acquisition.
    local_grant_ratio: f64,
    prefetches_per_acquire: f64,
}

struct Tally {
    ops: u64,
    latency: Histogram<u64>,
    /// Retries of each acquisition (+1, the histogram's floor is 1).
    retries: Histogram<u64>,
    hot_acquire: Histogram<u64>,
    stats: LockStats,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("static bounds are valid")
}

fn diff(after: &LockStats, before: &LockStats) -> LockStats {
    LockStats {
        acquisitions: after.acquisitions - before.acquisitions,
        releases: after.releases - before.releases,
        acquire_mn_ops: after.acquire_mn_ops - before.acquire_mn_ops,
        release_mn_ops: after.release_mn_ops - before.release_mn_ops,
        retries: after.retries - before.retries,
        refetches: after.refetches - before.refetches,
        messages_sent: after.messages_sent - before.messages_sent,
        resets: after.resets - before.resets,
        aborts: after.aborts - before.aborts,
        timeouts: after.timeouts - before.timeouts,
        stale_messages: after.stale_messages - before.stale_messages,
        local_grants: after.local_grants - before.local_grants,
        prefetches: after.prefetches - before.prefetches,
    }
}

struct Workload {
    locks: Vec<RemoteAddr>,
    objects: Vec<RemoteAddr>,
    zipf: KeyChooser,
    read_ratio: f64,
    cs_ns: Nanos,
    warm_up_end: Nanos,
    end: Nanos,
}

async fn client<L: RwLockClient>(
    mut lock: L,
    ctx: SimContext,
    work: Rc<Workload>,
    tally: Rc<RefCell<Tally>>,
) {
    let mut rng: WorkloadRng = rng_for(ctx.seed(), 0x10c5);
    let payload = vec![0x5au8; OBJECT_BYTES as usize];
    while ctx.now() < work.end {
        let rank = work.zipf.next_key(&mut rng);
        let mode = if rng.random::<f64>() < work.read_ratio {
            LockMode::Shared
        } else {
            LockMode::Exclusive
        };
        let before = *lock.stats();
        let start = ctx.now();
        let held = match lock.acquire(work.locks[rank as usize], mode).await {
            Ok(h) => h,
            Err(e) => {
                eprintln!("dmem bench locks: client stopped: {e}");
                return;
            }
        };
        let acquired = ctx.now();
        let object = work.objects[rank as usize];
        let access = match mode {
            LockMode::Shared => ctx.read(object, OBJECT_BYTES).await.map(drop),
            LockMode::Exclusive => ctx.write(object, &payload).await,
        };
        if let Err(e) = access {
            eprintln!("dmem bench locks: client stopped: {e}");
            return;
        }
        if work.cs_ns > 0 {
            ctx.sleep(work.cs_ns).await;
        }
        if let Err(e) = lock.release(held).await {
            eprintln!("dmem bench locks: client stopped: {e}");
            return;
        }
        let done = ctx.now();
        if done >= work.warm_up_end && done <= work.end {
            let mut t = tally.borrow_mut();
            t.ops += 1;
            let _ = t.latency.record((done - start).max(1));
            if rank == 0 {
                let _ = t.hot_acquire.record((acquired - start).max(1));
            }
            let d = diff(lock.stats(), &before);
            let _ = t.retries.record(d.retries + 1);
            t.stats = t.stats.merged(&d);
        }
    }
    let _ = lock.idle_until(work.end + 1_000_000).await;
}

enum Which {
    Cas,
    Dslr,
    Shift,
    /// DecLock; `Some(policy)`: hierarchical (§5).
    Dec(Option<FairnessPolicy>),
}

fn run_one(
    args: &Args,
    profile: &NicProfile,
    which: LockArg,
    zipf: &KeyChooser,
) -> anyhow::Result<Row> {
    let total = u64::from(args.cns) * u64::from(args.clients);
    // The CQL queue holds clients (§4) or, with hierarchical locking, CNs (§5; the paper
    // uses capacity 8 for 8 CNs).
    let capacity = cql_capacity(args, which);
    let (kind, layout) = lock_layout(args, which)?;
    let stride = layout.bytes.div_ceil(8) * 8;
    let objects_base = 4096u64;
    let locks_base = objects_base + args.locks * u64::from(OBJECT_BYTES);
    let memory = (locks_base + args.locks * stride).div_ceil(1 << 20) * (1 << 20);
    let sim = Sim::new(
        ClusterConfig::with_profile(profile.clone())
            .mns(1)
            .cns(args.cns)
            .threads_per_cn(args.threads)
            .mn_memory_bytes(memory)
            .seed(args.seed),
    )?;
    let mn = sim.mn(0);
    let region = sim.region(mn);
    let mut locks = Vec::with_capacity(args.locks as usize);
    let mut objects = Vec::with_capacity(args.locks as usize);
    for i in 0..args.locks {
        let l = locks_base + i * stride;
        if layout.initial.iter().any(|&b| b != 0) {
            sim.write_memory(mn, l, &layout.initial);
        }
        locks.push(region.at(l).context("MN region too small")?);
        objects.push(
            region
                .at(objects_base + i * u64::from(OBJECT_BYTES))
                .context("MN region too small")?,
        );
    }
    let duration = args.duration_ms * 1_000_000;
    let warm_up_end = duration / 10;
    let end = warm_up_end + duration;
    let work = Rc::new(Workload {
        locks,
        objects,
        zipf: zipf.clone(),
        read_ratio: args.read_ratio,
        cs_ns: args.cs_ns,
        warm_up_end,
        end,
    });
    let tally = Rc::new(RefCell::new(Tally {
        ops: 0,
        latency: histogram(),
        retries: histogram(),
        hot_acquire: histogram(),
        stats: LockStats::default(),
    }));
    let mut contexts = Vec::new();
    for cn in 0..args.cns {
        for c in 0..args.clients {
            let thread = (c % u32::from(args.threads)) as u16;
            contexts.push(sim.context(sim.cn(cn), thread)?);
        }
    }
    let directory = Directory::new(contexts.iter().map(|c| c.local_endpoint()).collect());
    let tables: Vec<Arc<LocalLockTable>> = match kind {
        Which::Dec(Some(policy)) => (0..args.cns)
            .map(|_| Arc::new(LocalLockTable::new(policy)))
            .collect(),
        _ => Vec::new(),
    };
    let clock_counter = region.at(CLOCK_COUNTER).context("MN region too small")?;
    for (i, ctx) in contexts.iter().enumerate() {
        let id = i as u32;
        let seed = ctx.seed() ^ args.seed;
        let (w, t) = (Rc::clone(&work), Rc::clone(&tally));
        match kind {
            Which::Cas => {
                let l = CasLockClient::new(ctx.clone(), id, CasLockConfig::default(), seed);
                sim.spawn(ctx, client(l, ctx.clone(), w, t));
            }
            Which::Dslr => {
                let l = DslrClient::new(ctx.clone(), DslrConfig::default(), seed);
                sim.spawn(ctx, client(l, ctx.clone(), w, t));
            }
            Which::Shift => {
                let l = ShiftLockClient::new(
                    ctx.clone(),
                    id,
                    directory.clone(),
                    ShiftLockConfig::default(),
                    seed,
                )?;
                sim.spawn(ctx, client(l, ctx.clone(), w, t));
            }
            Which::Dec(_) => {
                let cn = i / args.clients as usize;
                let local = tables.get(cn).map(|table| Hierarchy {
                    table: Arc::clone(table),
                    synchronizes: i % args.clients as usize == 0,
                    cns: u64::from(args.cns),
                    counter: clock_counter,
                });
                spawn_declock(&sim, ctx, id, &directory, capacity, seed, local, w, t)?;
            }
        }
    }
    sim.run_until(warm_up_end);
    let at_warm_up = sim.stats();
    sim.run_until(end);
    let stats = sim.stats();
    let measured = end - warm_up_end;
    let mn_busy = stats.mn_busy_fraction_since(&at_warm_up);
    let mn_ops = stats.mn_served_since(&at_warm_up, None);
    let atomics = stats.mn_served_since(&at_warm_up, Some(dmem_verbs::OpKind::Cas))
        + stats.mn_served_since(&at_warm_up, Some(dmem_verbs::OpKind::Faa));
    let t = tally.borrow();
    let acq = t.stats.acquisitions.max(1) as f64;
    let ops = t.ops.max(1) as f64;
    let hot_p50 = t.hot_acquire.value_at_quantile(0.5).max(1);
    Ok(Row {
        lock: which.name(),
        profile: profile.name.clone(),
        seed: args.seed,
        duration_ms: args.duration_ms,
        cns: args.cns,
        clients_per_cn: args.clients,
        total_clients: total,
        locks: args.locks,
        zipf: args.zipf,
        read_ratio: args.read_ratio,
        cs_ns: args.cs_ns,
        mops: round(t.ops as f64 / measured as f64 * 1e3, 4),
        p50_ns: t.latency.value_at_quantile(0.5),
        p99_ns: t.latency.value_at_quantile(0.99),
        p50_us: round(t.latency.value_at_quantile(0.5) as f64 / 1e3, 2),
        p99_us: round(t.latency.value_at_quantile(0.99) as f64 / 1e3, 2),
        mn_ops_per_acquire: round(t.stats.acquire_mn_ops as f64 / acq, 3),
        lock_mn_ops_per_op: round(
            (t.stats.acquire_mn_ops + t.stats.release_mn_ops) as f64 / ops,
            3,
        ),
        mn_ops_per_op: round(mn_ops as f64 / ops, 3),
        retries_per_acquire: round(t.stats.retries as f64 / acq, 3),
        retries_p99: t.retries.value_at_quantile(0.99).saturating_sub(1),
        retries_max: t.retries.max().saturating_sub(1),
        mn_atomic_mops: round(atomics as f64 / measured as f64 * 1e3, 3),
        mn_nic_busy: round(mn_busy, 3),
        fairness_hot: round(
            t.hot_acquire.value_at_quantile(0.99) as f64 / hot_p50 as f64,
            2,
        ),
        cql_capacity: if matches!(kind, Which::Dec(_)) {
            capacity
        } else {
            0
        },
        refetches_per_release: round(t.stats.refetches as f64 / t.stats.releases.max(1) as f64, 3),
        resets: t.stats.resets,
        local_grant_ratio: round(t.stats.local_grants as f64 / acq, 3),
        prefetches_per_acquire: round(t.stats.prefetches as f64 / acq, 3),
    })
}

macro_rules! with_capacity {
    ($capacity:expr, $c:ident => $body:expr) => {
        match $capacity {
            8 => { const $c: usize = 8; $body }
            16 => { const $c: usize = 16; $body }
            32 => { const $c: usize = 32; $body }
            64 => { const $c: usize = 64; $body }
            128 => { const $c: usize = 128; $body }
            256 => { const $c: usize = 256; $body }
            512 => { const $c: usize = 512; $body }
            1024 => { const $c: usize = 1024; $body }
            other => bail!(
                "DecLock's client-level queue needs one entry per client; {other} entries are not supported (at most 1024 clients in total)"
            ),
        }
    };
}

fn cql_layout(capacity: usize) -> anyhow::Result<LockLayout> {
    Ok(with_capacity!(capacity, C => dmem_locks::declock::layout::<C>()))
}

/// A hierarchical DecLock client's CN-level parts (§5).
struct Hierarchy {
    table: Arc<LocalLockTable>,
    /// This client synchronises its CN's clock (§5.3); the others wait for it.
    synchronizes: bool,
    cns: u64,
    counter: RemoteAddr,
}

/// MN offset of the §5.3 clock synchronisation counter (below the objects).
const CLOCK_COUNTER: u64 = 64;

/// How often a CN READs the synchronisation counter, and how often its other clients
/// look whether the clock is set, ns.
const CLOCK_POLL_NS: Nanos = 1_000;

#[allow(clippy::too_many_arguments)]
fn spawn_declock(
    sim: &Sim,
    ctx: &SimContext,
    id: u32,
    directory: &Directory,
    capacity: usize,
    seed: u64,
    local: Option<Hierarchy>,
    work: Rc<Workload>,
    tally: Rc<RefCell<Tally>>,
) -> anyhow::Result<()> {
    with_capacity!(capacity, C => {
        let Some(h) = local else {
            let l = DecLockClient::<_, C>::new(
                ctx.clone(),
                id,
                directory.clone(),
                Rc::new(NoFailures),
                DecLockConfig::default(),
                seed,
            )?;
            sim.spawn(ctx, client(l, ctx.clone(), work, tally));
            return Ok(());
        };
        let mut l = DecLockClient::<_, C>::hierarchical(
            ctx.clone(),
            id,
            directory.clone(),
            Rc::new(NoFailures),
            DecLockConfig::default(),
            seed,
            h.table,
        )?;
        let c = ctx.clone();
        sim.spawn(ctx, async move {
            let synced = if h.synchronizes {
                l.synchronize_clock(h.counter, h.cns, CLOCK_POLL_NS).await.map(drop)
            } else {
                l.wait_for_clock(CLOCK_POLL_NS).await
            };
            if let Err(e) = synced {
                eprintln!("dmem bench locks: clock synchronisation failed: {e}");
                return;
            }
            client(l, c, work, tally).await;
        });
    });
    Ok(())
}

#[derive(clap::Parser, Debug)]
struct Cli {
    #[command(flatten)]
    args: Args,
}

/// Runs `dmem bench locks ARGV...` (flags only) without printing; one JSON row per lock.
///
/// # Errors
/// A bad flag or a run that could not be built.
pub(crate) fn measure(argv: &[&str]) -> anyhow::Result<Vec<serde_json::Value>> {
    use clap::Parser as _;
    let args =
        Cli::try_parse_from(std::iter::once("dmem-bench-locks").chain(argv.iter().copied()))?.args;
    let locks = args.validate()?;
    let profile = common::load_profile(&args.profile)?;
    let zipf = KeyChooser::new(
        args.locks,
        KeyDistribution::Zipf { theta: args.zipf },
        false,
    );
    locks
        .into_iter()
        .map(|which| {
            Ok(serde_json::to_value(run_one(
                &args, &profile, which, &zipf,
            )?)?)
        })
        .collect()
}

/// Runs `dmem bench locks`.
pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let locks = args.validate()?;
    let profile = common::load_profile(&args.profile)?;
    let zipf = KeyChooser::new(
        args.locks,
        KeyDistribution::Zipf { theta: args.zipf },
        false,
    );
    let mut sink = Sink::new(args.json, args.csv.as_deref())?;
    let bar = common::progress(locks.len() as u64, "bench locks", "locks", args.json);
    let mut rows = Vec::new();
    for which in locks {
        bar.set_message(which.name());
        let row = run_one(&args, &profile, which, &zipf)?;
        sink.row(&row)?;
        bar.inc(1);
        rows.push(row);
    }
    bar.finish_and_clear();
    if !args.json {
        println!(
            "dmem bench locks  sim profile {}  1 MN  {} CN x {} clients ({} cores/CN) = {} clients  {} locks  zipf {}  read ratio {}  cs {} ns  {} ms  seed {}",
            profile.name,
            args.cns,
            args.clients,
            args.threads,
            u64::from(args.cns) * u64::from(args.clients),
            args.locks,
            args.zipf,
            args.read_ratio,
            args.cs_ns,
            args.duration_ms,
            args.seed
        );
        let mut t = common::table(&[
            "lock",
            "Mops",
            "p50 µs",
            "p99 µs",
            "acq ops/acquire",
            "lock ops/op",
            "retries/acquire",
            "MN busy",
            "hot p99/p50",
            "resets",
            "local grants",
        ]);
        for row in &rows {
            t.add_row(vec![
                row.lock.to_string(),
                format!("{:.3}", row.mops),
                format!("{:.2}", row.p50_us),
                format!("{:.2}", row.p99_us),
                format!("{:.2}", row.mn_ops_per_acquire),
                format!("{:.2}", row.lock_mn_ops_per_op),
                format!("{:.2}", row.retries_per_acquire),
                format!("{:.0}%", row.mn_nic_busy * 100.0),
                format!("{:.1}", row.fairness_hot),
                row.resets.to_string(),
                format!("{:.0}%", row.local_grant_ratio * 100.0),
            ]);
        }
        println!("{}", common::render(&t));
    }
    sink.finish("bench locks", &args, serde_json::json!({}))
}

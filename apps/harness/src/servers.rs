//! Symmetric protocols (Dandelion, FaSST) in real time: every server is a node of a real
//! fabric in this process, and its threads' message loops, its coordinators and their
//! closed-loop clients all run on this thread's real-time executor.
//!
//! [`run_servers`] makes `servers × threads` contexts of a [`LocalCluster`] (node `s` is
//! server `s`, port `t` its thread `t`; no MNs), deploys the protocol on them with
//! [`Protocol::deploy_servers`] (each server keeps its records in this process's memory and
//! reaches the others only through the fabric's two-sided messages), loads the workload,
//! runs `coroutines` coordinators per server thread — each a closed loop of the workload's
//! transactions, each tried up to [`ServersConfig::max_attempts`] times by the benchmarks'
//! one retry loop ([`crate::execute_with_reasons`], every attempt beginning after the
//! executor's other futures ran: [`crate::YieldingBegin`]) — and then checks the history
//! and the workload's invariants, as [`crate::run_bench`] does on the simulator. Aborts are
//! counted by reason and transactions given up by error, as [`crate::run_bench`] counts
//! them.
//!
//! One executor thread runs everything: the figures are real CPU cost of the protocol
//! code, the networking layer and the fabric's queues on one core, not a multi-core
//! throughput. On tcp the fabric's socket reader threads do part of the work outside that
//! thread, so its CPU time ([`ServersResult::cpu_s`]) covers all of it on shm only.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use dmem_deploy::{AnyContext, Deployment, Protocol, Recorder};
use dmem_runtime::RealClock;
use dmem_txn::History;
use dmem_verbs::{Clock, Nanos};
use dmem_workloads::{
    AnyWorkload, Executed, Outcome, TxnGenerator as _, TxnInfo as _, Workload as _,
};
use hdrhistogram::Histogram;

use crate::fabric::{Fabric, LocalCluster};
use crate::{
    HarnessError, REPORTED_COUNTERS, YieldingBegin, checked_verdict, execute_with_reasons,
    invariants_verdict,
};

/// How long a [`run_servers`] run lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunLength {
    /// Every coordinator runs this many transactions (retries included in each); all of
    /// them are measured.
    Txns(usize),
    /// Real time measured after a warm-up of a tenth of it.
    Duration(Duration),
}

/// One real-time run of a symmetric protocol.
#[derive(Debug, Clone)]
pub struct ServersConfig {
    /// A real fabric ([`Fabric::Shm`] or [`Fabric::Tcp`]).
    pub fabric: Fabric,
    /// Servers.
    pub servers: u16,
    /// Threads (message loops) per server.
    pub threads: u16,
    /// Coordinators per server thread.
    pub coroutines: u16,
    /// Seed of every coordinator's generator (xored with its id).
    pub seed: u64,
    /// How long.
    pub length: RunLength,
    /// Whether to record and check the history.
    pub check: bool,
    /// Tries per transaction before it is given up (at least 1), as
    /// [`BenchConfig::max_attempts`](crate::BenchConfig::max_attempts): [`MAX_ATTEMPTS`]
    /// retries an aborted transaction with its parameters, 1 drops it.
    ///
    /// [`MAX_ATTEMPTS`]: crate::MAX_ATTEMPTS
    pub max_attempts: u32,
    /// The wait before each retry, as [`BenchConfig::backoff`](crate::BenchConfig::backoff)
    /// (slept in real time).
    pub backoff: crate::Backoff,
}

/// What a [`run_servers`] run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct ServersResult {
    /// Measured real time, s.
    pub elapsed_s: f64,
    /// Committed transactions in the measured time.
    pub committed: u64,
    /// Committed transactions per second of real time.
    pub tps: f64,
    /// CPU time of the executor thread (which runs every server and client) in the
    /// measured time, s: on a shared host the thread gets only a share of a core, so
    /// throughput per CPU second is the figure that does not move with the host's load.
    pub cpu_s: f64,
    /// Committed transactions per CPU second of the executor thread.
    pub tps_per_cpu_s: f64,
    /// Aborted attempts / all attempts (measured; a given-up transaction's last try is
    /// aborted too).
    pub abort_rate: f64,
    /// Failed attempts of the measured transactions by reason ([`crate::failure_reason`]:
    /// the protocol's abort reason, else the error), the last try of a transaction given
    /// up included: as [`BenchResult::errors`](crate::BenchResult::errors).
    pub aborts: BTreeMap<String, u64>,
    /// Median latency of a committed transaction (retries included), µs.
    pub p50_us: f64,
    /// 99th-percentile latency, µs.
    pub p99_us: f64,
    /// Transactions the workload rolled back (measured).
    pub rolled_back: u64,
    /// Transactions given up after every retry, by error (measured): on a loaded host in
    /// real time an outcome, not a fault.
    pub given_up: BTreeMap<String, u64>,
    /// The checker's verdict: "ok", "skipped", or the first anomaly.
    pub checker: String,
    /// Transactions in the checked history.
    pub checked_txns: usize,
    /// The invariants' verdict: "ok" or the first violation.
    pub invariants: String,
    /// RPC messages (requests and responses) sent per second in the measured time.
    pub messages_per_s: f64,
    /// RPC messages sent per CPU second of the executor thread.
    pub messages_per_cpu_s: f64,
    /// Packets sent per second in the measured time.
    pub packets_per_s: f64,
    /// Messages per packet in the measured time (`None`: the protocol has no packets).
    pub msgs_per_packet: Option<f64>,
    /// Mean packet payload, bytes, in the measured time.
    pub packet_bytes: Option<f64>,
    /// The deployment's counters of [`REPORTED_COUNTERS`] it has, over the whole run.
    pub counters: BTreeMap<String, u64>,
    /// Committed transactions per type (measured): the committed mix.
    pub committed_per_type: BTreeMap<String, u64>,
}

#[derive(Default)]
struct Tally {
    committed: Cell<u64>,
    attempts: Cell<u64>,
    rolled_back: Cell<u64>,
    aborts: RefCell<BTreeMap<String, u64>>,
    given_up: RefCell<BTreeMap<String, u64>>,
    committed_per_type: RefCell<BTreeMap<String, u64>>,
    delta: Cell<i64>,
    running: Cell<usize>,
}

/// CPU time of the calling thread, ns.
fn thread_cpu() -> Nanos {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

/// The packet counters of a deployment: packets, messages, bytes.
fn packet_counters(d: &dyn Deployment) -> Option<(u64, u64, u64)> {
    Some((
        d.counter("packets")?,
        d.counter("messages")?,
        d.counter("packet_bytes")?,
    ))
}

/// Runs `workload` on the symmetric `protocol` in real time (see the module docs).
///
/// # Errors
/// [`HarnessError::Config`] for the simulator, an empty shape or `max_attempts` 0;
/// [`HarnessError::Deploy`]
/// if a context cannot be made or the protocol is not symmetric.
///
/// # Panics
/// If a transaction fails with an error that no retry can cure (a protocol fault).
pub fn run_servers(
    protocol: &dyn Protocol,
    workload: &AnyWorkload,
    cfg: &ServersConfig,
) -> Result<ServersResult, HarnessError> {
    if cfg.fabric == Fabric::Sim {
        return Err(HarnessError::Config(
            "run_servers runs on a real fabric; run_bench runs on the simulator",
        ));
    }
    if cfg.max_attempts == 0 {
        return Err(HarnessError::Config("max_attempts must be at least 1"));
    }
    let coordinators = u32::from(cfg.servers) * u32::from(cfg.threads) * u32::from(cfg.coroutines);
    if coordinators == 0 || coordinators >= u32::from(u16::MAX) {
        return Err(HarnessError::Config(
            "servers × threads × coroutines must be positive and below 65535",
        ));
    }
    let cluster = LocalCluster::with_threads(cfg.fabric, 0, cfg.servers, cfg.threads, 0, cfg.seed)?;
    let contexts = (0..cfg.servers)
        .map(|s| (0..cfg.threads).map(|t| cluster.context(s, t)).collect())
        .collect::<Result<Vec<Vec<AnyContext>>, _>>()?;
    let history = Rc::new(RefCell::new(if cfg.check {
        History::new()
    } else {
        History::discarding()
    }));
    let mut deployment = protocol.deploy_servers(
        contexts.clone(),
        &|ctx, task| cluster.spawn(ctx, task),
        Recorder::new(Rc::clone(&history)),
    )?;
    for (table, key, value) in workload.loader() {
        deployment.load(table, key, &value)?;
    }

    let clock = RealClock;
    let start = clock.now();
    let (warm_up_end, end, txns) = match cfg.length {
        RunLength::Txns(n) => (start, Nanos::MAX, n),
        RunLength::Duration(d) => {
            let d = u64::try_from(d.as_nanos()).unwrap_or(Nanos::MAX / 2);
            (start + d / 10, start + d / 10 + d, usize::MAX)
        }
    };
    let tally = Rc::new(Tally::default());
    let latency = Rc::new(RefCell::new(
        Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("static bounds are valid"),
    ));
    let workload = Rc::new(workload.clone());
    let mut id: u16 = 0;
    for per_thread in &contexts {
        for ctx in per_thread {
            for _ in 0..cfg.coroutines {
                let mut co = YieldingBegin(deployment.coordinator(ctx.clone(), id)?);
                let mut generator = workload.generator(u32::from(id), cfg.seed ^ u64::from(id));
                let (workload, tally, latency) =
                    (Rc::clone(&workload), Rc::clone(&tally), Rc::clone(&latency));
                let attempts = cfg.max_attempts;
                let mut pause =
                    crate::BackoffPause::new(cfg.backoff, clock, cfg.seed, id, Rc::default());
                tally.running.set(tally.running.get() + 1);
                cluster.spawn(ctx, async move {
                    let mut done = 0;
                    while done < txns && clock.now() < end {
                        done += 1;
                        let txn = generator.next_txn();
                        let began = clock.now();
                        let (executed, reasons) =
                            execute_with_reasons(&*workload, &mut co, &txn, attempts, &mut pause)
                                .await;
                        let finished = clock.now();
                        if let Executed::Committed {
                            outcome: Outcome::Commit { delta },
                            ..
                        } = executed
                        {
                            tally.delta.set(tally.delta.get() + delta);
                        }
                        if began < warm_up_end || finished > end {
                            continue;
                        }
                        let attempts = match &executed {
                            Executed::Committed { attempts, .. }
                            | Executed::RolledBack { attempts, .. }
                            | Executed::Failed { attempts, .. } => *attempts,
                        };
                        tally
                            .attempts
                            .set(tally.attempts.get() + u64::from(attempts));
                        for reason in reasons {
                            *tally.aborts.borrow_mut().entry(reason).or_default() += 1;
                        }
                        match executed {
                            Executed::Committed { .. } => {
                                tally.committed.set(tally.committed.get() + 1);
                                let _ = latency.borrow_mut().record((finished - began).max(1));
                                if let Some(t) = workload.txn_types().get(txn.type_index()) {
                                    *tally
                                        .committed_per_type
                                        .borrow_mut()
                                        .entry(t.name.to_owned())
                                        .or_default() += 1;
                                }
                            }
                            Executed::RolledBack { .. } => {
                                tally.rolled_back.set(tally.rolled_back.get() + 1);
                            }
                            Executed::Failed { error, .. } if error.is_retryable() => {
                                *tally
                                    .given_up
                                    .borrow_mut()
                                    .entry(error.to_string())
                                    .or_insert(0) += 1;
                            }
                            Executed::Failed { error, .. } => {
                                panic!("a transaction failed: {error}")
                            }
                        }
                    }
                    tally.running.set(tally.running.get() - 1);
                });
                id += 1;
            }
        }
    }

    // Counters at the start and the end of the measured time, then wait for every client.
    let deployment: Rc<dyn Deployment> = Rc::from(deployment);
    let (d, t) = (Rc::clone(&deployment), Rc::clone(&tally));
    let any = contexts[0][0].clone();
    let (at_start, at_end) = cluster.block_on(&any, async move {
        if warm_up_end > clock.now() {
            clock.sleep_until(warm_up_end).await;
        }
        let at_start = (clock.now(), thread_cpu(), packet_counters(&*d));
        while t.running.get() > 0 && clock.now() < end {
            clock.sleep(1_000_000).await;
        }
        let at_end = (clock.now().min(end), thread_cpu(), packet_counters(&*d));
        while t.running.get() > 0 {
            clock.sleep(1_000_000).await;
        }
        (at_start, at_end)
    });
    let elapsed = at_end.0.saturating_sub(at_start.0).max(1) as f64 / 1e9;
    let cpu = at_end.1.saturating_sub(at_start.1).max(1) as f64 / 1e9;
    let packets = match (at_start.2, at_end.2) {
        (Some((p0, m0, b0)), Some((p1, m1, b1))) => Some((p1 - p0, m1 - m0, b1 - b0)),
        _ => None,
    };
    let history = history.borrow();
    let (checker, checked_txns) = checked_verdict(&history, protocol.isolation(), cfg.check);
    let violations = workload.check(|t, k| deployment.read_final(t, k), tally.delta.get());
    let invariants = invariants_verdict(&violations);
    let latency = latency.borrow();
    let committed = tally.committed.get();
    let attempts = tally.attempts.get();
    Ok(ServersResult {
        elapsed_s: elapsed,
        committed,
        tps: committed as f64 / elapsed,
        cpu_s: cpu,
        tps_per_cpu_s: committed as f64 / cpu,
        abort_rate: attempts.saturating_sub(committed + tally.rolled_back.get()) as f64
            / attempts.max(1) as f64,
        aborts: tally.aborts.borrow().clone(),
        p50_us: latency.value_at_quantile(0.5) as f64 / 1e3,
        p99_us: latency.value_at_quantile(0.99) as f64 / 1e3,
        rolled_back: tally.rolled_back.get(),
        given_up: tally.given_up.borrow().clone(),
        checker,
        checked_txns,
        invariants,
        messages_per_s: packets.map_or(0.0, |(_, m, _)| m as f64 / elapsed),
        messages_per_cpu_s: packets.map_or(0.0, |(_, m, _)| m as f64 / cpu),
        packets_per_s: packets.map_or(0.0, |(p, _, _)| p as f64 / elapsed),
        msgs_per_packet: packets
            .filter(|(p, _, _)| *p > 0)
            .map(|(p, m, _)| m as f64 / p as f64),
        packet_bytes: packets
            .filter(|(p, _, _)| *p > 0)
            .map(|(p, _, b)| b as f64 / p as f64),
        counters: REPORTED_COUNTERS
            .iter()
            .filter_map(|&n| deployment.counter(n).map(|v| (n.to_owned(), v)))
            .collect(),
        committed_per_type: tally.committed_per_type.borrow().clone(),
    })
}

//! `dmem recover --protocol pandora|ford --workload W --crash cn|half ...`: a compute-node
//! crash in the middle of a workload run, and the recovery that follows (Pandora §3.2, §6.1,
//! §6.3).
//!
//! The simulated cluster has `--cns` CNs running coordinators plus one more CN that runs the
//! failure detector and the recovery coordinator (Pandora §6.3 uses a dedicated FD machine).
//! Every coordinator CN sends heartbeats every `--heartbeat-us` and listens for stray-lock
//! notifications. At `--crash-at-ms` the last CN (`--crash cn`) or the last half of the CNs
//! (`--crash half`, half of the coordinators) crash: their tasks stop and whatever they had
//! not posted never lands. The detector suspects a CN after `--detect-timeout-us` without a
//! heartbeat and recovers it through the protocol's [`dmem_deploy::Deployment`] (for FORD
//! and Pandora, `dmem_ford::RecoveryManager::recover`): active-link termination at every MN,
//! log recovery of each of its coordinators (roll forward or back, truncation), then
//!
//! * Pandora: the stray-lock notification; survivors steal the remaining stray locks (PILL);
//! * pandora-lock-logging: the logged locks are released in log recovery, then notification;
//! * FORD: the stop-the-world scan of the whole store for stray locks. The survivors stop
//!   starting transactions from detection until the scan is over (the paper's Baseline stops
//!   the KVS, §6.1); the pause flag reaches them at once (a control-plane broadcast the
//!   simulation does not charge for), and transactions already running finish first.
//! * LOTUS (§6): the failed CN's transactions decided from its commit logs, its locks
//!   released on the survivors (a failure notice to each); with `--restart-after-us US` the
//!   crashed CNs come back US µs after detection, serve their shards' locks again after
//!   their broadcast and run their coordinators again (the report's `restart` lines: when
//!   they serve again, locks they granted, what their new coordinators committed); with
//!   `--crash-again-at-ms MS` the restarted CNs crash a second time and are recovered and
//!   restarted again (the `second crash` line). Pandora, FORD and Motor restart crashed
//!   CNs too (`--restart-after-us`), once their recovery is over.
//!
//! Recovery latency is measured in virtual time from the first detection to the end of the
//! last CN's recovery, when every stray transaction is decided (and, for FORD, every stray
//! lock released). Detection time is from the crash to the first detection. The committed
//! transactions are counted per 1 ms of virtual time over the whole run. After the run the
//! whole history goes through the checker and the final state through the workload's
//! consistency checks, with the conserved-quantity change of a crashed in-flight transaction
//! counted iff recovery rolled it forward.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use anyhow::{Context as _, ensure};
use clap::Args as ClapArgs;
use dmem_cli::bench_txn::parse_workload;
use dmem_cli::bench_txn::{ScaleArg, WorkloadArg, memory_estimate};
use dmem_cli::common::{self, CheckFailed, Sink};
use dmem_deploy::{
    ClusterShape, Decision, Deployed, Deployment, RecoveryEvent, RecoveryTiming, Registry,
    deploy_loaded, require_sim_recovery,
};
use dmem_harness::{MAX_ATTEMPTS, deploy_spec, verdict};
use dmem_sim::NicProfile;
use dmem_txn::{Coordinator, History, Transaction, TxnError, TxnOutcome};
use dmem_verbs::{Clock, Nanos};
use dmem_workloads::{AnyWorkload, Executed, Outcome, TxnGenerator, TxnInfo, Workload};
use serde::Serialize;

/// Arguments of `dmem recover`.
#[derive(Debug, ClapArgs, Serialize)]
pub(crate) struct Args {
    /// Protocol, any registered name without parameters: pandora, ford (fixed FORD with the
    /// stop-the-world scan) or pandora-lock-logging (traditional lock logging instead of
    /// PILL, Pandora §6.1).
    #[arg(long, default_value = "pandora")]
    protocol: String,
    /// Workload.
    #[arg(long, value_enum, default_value = "smallbank")]
    workload: WorkloadArg,
    /// Size preset of the workload (its memory is estimated and checked before loading).
    #[arg(long, value_enum, default_value = "small")]
    scale: ScaleArg,
    /// What crashes: `cn` (the last coordinator CN) or `half` (the last half of the
    /// coordinator CNs, so half of the coordinators; needs an even --cns).
    #[arg(long, value_enum, default_value = "cn")]
    crash: Crash,
    /// Instead of --crash: the last N coordinator CNs crash at once (LOTUS §8.4 crashes 3 of
    /// 9); at least one CN must survive.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    crash_cns: Option<u16>,
    /// When the crash happens, ms of virtual time from the start.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    crash_at_ms: u64,
    /// Length of the run, ms of virtual time (recovery that is still running then finishes).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    duration_ms: u64,
    /// Heartbeat timeout of the failure detector, µs (Pandora §6.1 uses 5 ms).
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..=60_000_000))]
    detect_timeout_us: u64,
    /// Period of the CNs' heartbeats, µs.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=60_000_000))]
    heartbeat_us: u64,
    /// Poll period of the detector and of the notification listeners, µs.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    poll_us: u64,
    /// NIC profile of the simulated cluster: cx3, cx4, cx5, cx6 or a TOML file.
    #[arg(long, default_value = "cx5")]
    profile: String,
    /// Memory nodes (replication degree min(3, MNs)).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=64))]
    mns: u16,
    /// Compute nodes running coordinators (one more CN runs the failure detector).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(2..=4096))]
    cns: u16,
    /// Threads (cores) per CN.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: u16,
    /// Coroutines (coordinators) per thread: threads × coroutines transactions are
    /// outstanding on a CN when it crashes.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=1024))]
    coroutines: u16,
    /// Seed of the cluster and of every coordinator's transaction generator.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// CN restart (LOTUS §6, Pandora §6.3; LOTUS, Pandora, FORD and Motor): each crashed CN
    /// comes back this many µs after its failure was detected. LOTUS: with an empty lock
    /// table, serving its shards again once it has broadcast that its old transactions are
    /// finished (without it, its shards move to the survivors); from its broadcast on, the
    /// restarted CN runs its coordinators again (same ids and log regions, new transaction
    /// ids, fresh caches, fresh generators). Pandora/FORD: once recovered, with new
    /// coordinator ids. Motor: once recovered, same ids (op logs recovered and cleared) and
    /// new transaction ids.
    #[arg(long, value_name = "US", value_parser = clap::value_parser!(u64).range(0..=60_000_000))]
    restart_after_us: Option<u64>,
    /// With --restart-after-us: the crashed CNs crash a second time at this ms of virtual
    /// time (their restarted incarnation, which must be serving again by then), and are
    /// recovered and restarted again.
    #[arg(long, value_name = "MS", requires = "restart_after_us", value_parser = clap::value_parser!(u64).range(1..=60_000))]
    crash_again_at_ms: Option<u64>,
    /// Skip the history checker.
    #[arg(long)]
    no_check: bool,
    /// Print JSON lines instead of the report: the report as one object, then a summary.
    #[arg(long)]
    json: bool,
    /// Also write the report to this CSV file (one row).
    #[arg(long, value_name = "FILE")]
    csv: Option<std::path::PathBuf>,
}

/// What crashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Crash {
    /// The last coordinator CN.
    #[value(name = "cn")]
    #[serde(rename = "cn")]
    OneCn,
    /// The last half of the coordinator CNs.
    Half,
}

impl Args {
    fn validate(&self, registry: &Registry) -> anyhow::Result<(AnyWorkload, NicProfile, Crash)> {
        let crash = self.crash;
        ensure!(
            self.cns >= 2,
            "--cns must be at least 2: one CN crashes, another keeps running"
        );
        ensure!(
            crash == Crash::OneCn || self.crash_cns.is_some() || self.cns.is_multiple_of(2),
            "--crash half needs an even --cns (got {})",
            self.cns
        );
        if let Some(n) = self.crash_cns {
            ensure!(
                n < self.cns,
                "--crash-cns {n} leaves no CN running with --cns {}: give fewer than --cns",
                self.cns
            );
        }
        ensure!(
            self.detect_timeout_us > self.heartbeat_us,
            "--detect-timeout-us ({}) must exceed --heartbeat-us ({}), or live CNs are suspected",
            self.detect_timeout_us,
            self.heartbeat_us
        );
        ensure!(
            self.crash_at_ms * 1_000 + self.detect_timeout_us < self.duration_ms * 1_000,
            "the crash at {} ms plus the {} µs detection timeout must fall before --duration-ms {}",
            self.crash_at_ms,
            self.detect_timeout_us,
            self.duration_ms
        );
        if let Some(again) = self.crash_again_at_ms {
            ensure!(
                again > self.crash_at_ms
                    && again * 1_000 + self.detect_timeout_us < self.duration_ms * 1_000,
                "--crash-again-at-ms {again} must fall after --crash-at-ms {} and, with the detection timeout, before --duration-ms {}",
                self.crash_at_ms,
                self.duration_ms
            );
        }
        let coordinators =
            u32::from(self.cns) * u32::from(self.threads) * u32::from(self.coroutines);
        ensure!(
            coordinators < u32::from(u16::MAX),
            "{coordinators} coordinators exceed the 16-bit coordinator ids: lower --cns, --threads or --coroutines"
        );
        registry.get(&self.protocol).context("in --protocol")?;
        ensure!(
            !self.protocol.contains(':') || self.protocol.starts_with("lotus:"),
            "--protocol {}: dmem recover runs registered protocols without parameters, and LOTUS with its switches ({})",
            self.protocol,
            registry
                .names()
                .into_iter()
                .filter(|n| !n.contains(':'))
                .collect::<Vec<_>>()
                .join(", ")
        );
        self.deployed_protocol(registry)?;
        let profile = common::load_profile(&self.profile)?;
        let (workload, _) = parse_workload(self.workload.name(), self.scale.name())?;
        common::ensure_memory(
            memory_estimate(
                registry,
                &self.protocol,
                &workload,
                coordinators as u16,
                self.mns,
            )?,
            &format!(
                "{} at --scale {} on {} MNs",
                self.workload.name(),
                self.scale.name(),
                self.mns
            ),
            "--scale (tiny, small)",
        )?;
        Ok((workload, profile, crash))
    }

    /// The registry name deployed: `--protocol`, or with --restart-after-us the name the
    /// protocol gives itself with its crashed CNs restarted (`Protocol::restarting_name`).
    fn deployed_protocol(&self, registry: &Registry) -> anyhow::Result<String> {
        let Some(us) = self.restart_after_us else {
            return Ok(self.protocol.clone());
        };
        registry
            .get(&self.protocol)?
            .restarting_name(us)
            .ok_or_else(|| {
                let restarting: Vec<String> = registry
                    .names()
                    .into_iter()
                    .filter(|n| {
                        registry
                            .get(n)
                            .is_ok_and(|p| p.restarting_name(us).is_some())
                    })
                    .collect();
                anyhow::anyhow!(
                    "--restart-after-us: {} does not restart crashed CNs; these do: {}",
                    self.protocol,
                    restarting.join(", ")
                )
            })
    }

    /// The CN indices that crash.
    fn crashed_cns(&self, crash: Crash) -> std::ops::Range<u16> {
        if let Some(n) = self.crash_cns {
            return self.cns - n..self.cns;
        }
        match crash {
            Crash::OneCn => self.cns - 1..self.cns,
            Crash::Half => self.cns / 2..self.cns,
        }
    }
}

/// One coordinator's transaction whose commit was started but not acknowledged: the length
/// of the history when its commit started and its change to the workload's conserved
/// quantity. Which transaction it was is in the history: the coordinator's first record at
/// or after that mark (protocols record a transaction when it reaches its commit decision).
type Pending = Rc<Cell<Option<(usize, i64)>>>;

/// Like [`dmem_workloads::execute`], but notes the transaction in `pending` from the
/// commit decision until the commit is acknowledged, so that a crash in between can be
/// matched with recovery's decision. A commit that fails with a fabric error stays pending
/// (its outcome is in doubt) and ends the loop.
async fn execute_tracked<C: Coordinator>(
    workload: &AnyWorkload,
    co: &mut C,
    txn: &<AnyWorkload as Workload>::Txn,
    pending: &Pending,
    history: &RefCell<History>,
) -> Executed {
    let mut attempts = 0;
    loop {
        attempts += 1;
        let mut tx = match co.begin(txn.kind()).await {
            Ok(tx) => tx,
            Err(error) if error.is_retryable() && attempts < MAX_ATTEMPTS => continue,
            Err(error) => return Executed::Failed { error, attempts },
        };
        let error = match workload.run(txn, &mut tx).await {
            Ok(Outcome::Rollback(reason)) => {
                tx.abort().await;
                return Executed::RolledBack { reason, attempts };
            }
            Ok(outcome) => {
                let delta = match outcome {
                    Outcome::Commit { delta } => delta,
                    Outcome::CommitMissed(_) | Outcome::Rollback(_) => 0,
                };
                pending.set(Some((history.borrow().txns.len(), delta)));
                match tx.commit().await {
                    Ok(()) => {
                        pending.set(None);
                        return Executed::Committed { outcome, attempts };
                    }
                    Err(e @ TxnError::Verbs(_)) => {
                        return Executed::Failed { error: e, attempts };
                    }
                    Err(e) => {
                        pending.set(None);
                        e
                    }
                }
            }
            Err(e) => {
                tx.abort().await;
                e
            }
        };
        if !error.is_retryable() || attempts >= MAX_ATTEMPTS {
            return Executed::Failed { error, attempts };
        }
    }
}

/// The report of one run.
#[derive(Debug, Serialize)]
struct Report {
    protocol: String,
    workload: String,
    scale: String,
    crash: String,
    /// CNs running coordinators, and how many crashed.
    cns: u16,
    crashed_cns: u16,
    /// Coordinators (= outstanding transactions) on each CN.
    coordinators_per_cn: u32,
    crash_at_us: f64,
    detect_timeout_us: u64,
    /// Crash → first detection.
    detection_us: f64,
    /// First detection → every crashed CN recovered (all stray transactions decided; FORD:
    /// stray locks scanned and released).
    recovery_latency_us: f64,
    /// Parts of the recovery latency, summed over the crashed CNs: link termination, log
    /// recovery (with truncation and, for lock logging, release of logged locks), and the
    /// rest (FORD's scan; the notification send).
    terminate_us: f64,
    log_recovery_us: f64,
    scan_us: f64,
    /// Logged stray transactions recovery decided (one per crashed coordinator with a valid
    /// log), and how.
    recovered_txns: usize,
    rolled_forward: usize,
    rolled_back: usize,
    /// Of those, the ones caught mid-flight (a replica restored or a lock released); a
    /// roll-forward of a transaction that had already finished changes nothing.
    in_flight_txns: usize,
    restored_replicas: usize,
    /// Locks released by log recovery (logged transactions' and, for lock logging, logged
    /// locks).
    released_locks: usize,
    /// Stray locks FORD's scan released.
    scanned_locks: usize,
    /// Records loaded, and what a full scan reads: one READ per index bucket (of every
    /// partition, at its primary) and the bytes of those buckets' items.
    records: u64,
    scan_reads: u64,
    scan_bytes: u64,
    /// Stray locks the survivors stole afterwards (PILL).
    steals: u64,
    /// LOTUS CN restart (--restart-after-us): CNs that came back and broadcast, the crash →
    /// last broadcast span (serving again), broadcasts made before the CN's recovery was
    /// over and locks granted by a restarted CN before its recovery was over (both 0 unless
    /// the protocol is wrong), and locks restarted CNs granted after their broadcast.
    restarted_cns: u64,
    serving_again_us: Option<f64>,
    /// Whether the restarted CNs serve locks (LOTUS §6): the grant counts below apply.
    #[serde(skip)]
    restart_serves_locks: bool,
    early_broadcasts: u64,
    restart_grants_before_recovered: u64,
    restart_grants_after: u64,
    /// Coordinators restarted CNs ran again (summed over restarts), and the transactions
    /// they committed (counted in `series` and `committed` too).
    restarted_coordinators: u64,
    restarted_committed: u64,
    /// LOTUS: live CNs' tables still fencing a CN that is not failed, after the run (0
    /// unless a rejoin broadcast was lost for good).
    stale_fences: u64,
    /// --crash-again-at-ms: CNs recovered from their second crash, and the latency of that
    /// recovery (its first detection → its last CN recovered); the other recovery figures
    /// are the first crash's.
    second_crash_recovered: usize,
    second_recovery_latency_us: Option<f64>,
    /// In-flight transactions the second recovery decided (the restarted incarnation's).
    second_recovered_txns: usize,
    /// Committed transactions per 1 ms of virtual time, from 0 to --duration-ms.
    series: Vec<u64>,
    /// Mean committed per ms before the crash and after recovery finished (0 if none).
    before_per_ms: f64,
    after_per_ms: f64,
    committed: u64,
    /// Verdict of the history checker: "ok", "skipped", or the first anomaly.
    checker: String,
    checked_txns: usize,
    /// Transactions left with an unknown outcome by the crash.
    in_doubt: usize,
    /// Verdict of the workload's consistency checks.
    invariants: String,
}

/// Runs `dmem recover` on `registry`'s protocols.
pub(crate) fn run(args: Args, registry: &Registry) -> anyhow::Result<()> {
    let mut sink = Sink::new(args.json, args.csv.as_deref())?;
    let report = measure_report(&args, registry)?;
    sink.row(&report)?;
    print_report(&args, &report)?;
    sink.finish("recover", &args, serde_json::json!({ "seed": args.seed }))?;
    if !((report.checker == "ok" || report.checker == "skipped") && report.invariants == "ok") {
        return Err(CheckFailed(format!(
            "correctness check failed after recovery: checker {}, invariants {}",
            report.checker, report.invariants
        ))
        .into());
    }
    common::committed_something(
        &format!("protocol `{}`", report.protocol),
        report.committed,
        "raise --duration-ms or --crash-at-ms",
    )
}

#[derive(clap::Parser, Debug)]
struct Cli {
    #[command(flatten)]
    args: Args,
}

/// Runs `dmem recover ARGV...` (flags only) without printing; the report as JSON.
///
/// # Errors
/// A bad flag or a run that could not be built.
pub(crate) fn measure(argv: &[&str], registry: &Registry) -> anyhow::Result<serde_json::Value> {
    use clap::Parser as _;
    let cli = Cli::try_parse_from(std::iter::once("dmem-recover").chain(argv.iter().copied()))?;
    Ok(serde_json::to_value(measure_report(&cli.args, registry)?)?)
}

fn measure_report(args: &Args, registry: &Registry) -> anyhow::Result<Report> {
    let (workload, profile, crash) = args.validate(registry)?;
    let protocol = registry.get(&args.deployed_protocol(registry)?)?;
    let per_cn = u32::from(args.threads) * u32::from(args.coroutines);
    let coordinators = args.cns * args.threads * args.coroutines;
    let history = Rc::new(RefCell::new(History::new()));
    let Deployed {
        sim,
        mut deployment,
        ..
    } = deploy_loaded(
        &*protocol,
        &ClusterShape {
            mns: args.mns,
            cns: args.cns + 1,
            threads: args.threads,
            seed: args.seed,
            profile: profile.clone(),
            min_mn_bytes: 1 << 20,
            message_faults: dmem_sim::MessageFaults::default(),
        },
        &deploy_spec(&workload, coordinators),
        &history,
        || workload.loader(),
    )
    .context("building the simulated cluster")?;

    let crash_at: Nanos = args.crash_at_ms * 1_000_000;
    let end: Nanos = args.duration_ms * 1_000_000;
    let poll: Nanos = args.poll_us * 1_000;
    let buckets = usize::try_from(args.duration_ms).context("--duration-ms")?;
    let series = Rc::new(RefCell::new(vec![0u64; buckets]));
    let delta = Rc::new(Cell::new(0i64));
    let name = protocol.name();
    let paused = require_sim_recovery(&mut *deployment, &name)?.paused();
    let workload = Rc::new(workload);

    let pendings: Rc<RefCell<Vec<(u16, Pending)>>> = Rc::new(RefCell::new(Vec::new()));
    let restarted_committed = Rc::new(Cell::new(0u64));
    // Runs one coordinator's client loop; `incarnation` > 0 for a coordinator of a
    // restarted CN (LOTUS §6), whose generator gets a seed of its own.
    let spawn_client = {
        let (workload, series, delta, paused, history, pendings, restarted_committed, sim) = (
            Rc::clone(&workload),
            Rc::clone(&series),
            Rc::clone(&delta),
            Rc::clone(&paused),
            Rc::clone(&history),
            Rc::clone(&pendings),
            Rc::clone(&restarted_committed),
            Rc::clone(&sim),
        );
        let seed = args.seed;
        Rc::new(
            move |ctx: dmem_sim::SimContext,
                  id: u16,
                  mut co: dmem_txn::BoxCoordinator,
                  incarnation: u64| {
                let mut generator = workload.generator(
                    u32::from(id),
                    seed ^ u64::from(id) ^ incarnation.wrapping_mul(0x9E37_79B9_7F4A_7C15),
                );
                let pending: Pending = Rc::new(Cell::new(None));
                pendings.borrow_mut().push((id, Rc::clone(&pending)));
                let (workload, series, delta, paused, history, restarted_committed) = (
                    Rc::clone(&workload),
                    Rc::clone(&series),
                    Rc::clone(&delta),
                    Rc::clone(&paused),
                    Rc::clone(&history),
                    Rc::clone(&restarted_committed),
                );
                let task_ctx = ctx.clone();
                sim.spawn(&task_ctx, async move {
                    'run: while ctx.now() < end {
                        while paused.get() {
                            if ctx.now() >= end {
                                break 'run;
                            }
                            ctx.sleep(poll).await;
                        }
                        let txn = generator.next_txn();
                        match execute_tracked(&workload, &mut co, &txn, &pending, &history).await {
                            Executed::Committed { outcome, .. } => {
                                if let Outcome::Commit { delta: d } = outcome {
                                    delta.set(delta.get() + d);
                                }
                                let ms =
                                    usize::try_from(ctx.now() / 1_000_000).unwrap_or(usize::MAX);
                                if let Some(b) = series.borrow_mut().get_mut(ms) {
                                    *b += 1;
                                }
                                if incarnation > 0 {
                                    restarted_committed.set(restarted_committed.get() + 1);
                                }
                            }
                            Executed::Failed {
                                error: TxnError::Verbs(_),
                                ..
                            } => break,
                            Executed::RolledBack { .. } | Executed::Failed { .. } => {}
                        }
                    }
                });
            },
        )
    };
    let mut id: u16 = 0;
    for cn in 0..args.cns {
        for thread in 0..args.threads {
            for _ in 0..args.coroutines {
                let ctx = sim.context(sim.cn(cn), thread)?;
                let co = deployment.coordinator(ctx.clone().into(), id)?;
                spawn_client(ctx, id, co, 0);
                id += 1;
            }
        }
    }
    // LOTUS §6: a restarted CN runs its coordinators again from its broadcast on.
    {
        let restarts: Rc<RefCell<Vec<(u16, u64)>>> = Rc::default();
        require_sim_recovery(&mut *deployment, &name)?.run_late_coordinators(Rc::new(
            move |ctx, id, co| {
                // The incarnation of this coordinator: one more than its last one.
                let mut r = restarts.borrow_mut();
                let incarnation = match r.iter_mut().find(|(c, _)| *c == id) {
                    Some((_, n)) => {
                        *n += 1;
                        *n
                    }
                    None => {
                        r.push((id, 1));
                        1
                    }
                };
                drop(r);
                spawn_client(ctx, id, co, incarnation);
            },
        ));
    }
    require_sim_recovery(&mut *deployment, &name)?.start_recovery(
        &sim,
        args.cns,
        RecoveryTiming {
            heartbeat: args.heartbeat_us * 1_000,
            timeout: args.detect_timeout_us * 1_000,
            poll,
            until: end,
        },
    )?;
    let crashed: Vec<u16> = args.crashed_cns(crash).collect();
    let crash_again = args.crash_again_at_ms.map(|ms| ms * 1_000_000);
    for &cn in &crashed {
        sim.crash_at(sim.cn(cn), crash_at);
        if let Some(at) = crash_again {
            sim.crash_at(sim.cn(cn), at);
        }
    }

    let progress = common::progress(end / 1_000, &args.protocol, "µs virtual", args.json);
    let step = (end / 100).max(1);
    let mut now = 0;
    while now < end {
        now = (now + step).min(end);
        sim.run_until(now);
        progress.set_position(now / 1_000);
    }
    // In-flight transactions and a recovery still running (FORD's scan) finish.
    sim.run_until_idle();
    progress.finish_and_clear();

    let recovery = require_sim_recovery(&mut *deployment, &name)?;
    if let Some(e) = recovery.recovery_error() {
        anyhow::bail!("recovery failed: {e}");
    }
    let events = recovery.recovery_events();
    let scan = recovery.scan_cost().unwrap_or((0, 0));
    let crashes = crashed.len() * if crash_again.is_some() { 2 } else { 1 };
    ensure!(
        events.len() == crashes,
        "the failure detector recovered {} of {} CN crashes before the end of the run: raise --duration-ms{}",
        events.len(),
        crashes,
        if crash_again.is_some() {
            " (or the CNs were not serving again by --crash-again-at-ms)"
        } else {
            ""
        }
    );

    // Crashed in-flight transactions count toward the conserved quantity iff rolled forward.
    let mut committed_delta = delta.get();
    {
        let history = history.borrow();
        for (c, pending) in pendings.borrow().iter() {
            let Some((mark, d)) = pending.get() else {
                continue;
            };
            let in_doubt = history.txns[mark.min(history.txns.len())..]
                .iter()
                .find(|t| t.id.coordinator.0 == u32::from(*c))
                .map(|t| t.id.seq);
            let forward = events.iter().flat_map(|e| &e.coordinators).any(|r| {
                r.coordinator == *c
                    && in_doubt.is_some()
                    && r.txn == in_doubt
                    && r.decision == Some(Decision::RollForward)
            });
            if forward {
                committed_delta += d;
            }
        }
    }
    let steals = deployment.counter("steals").unwrap_or(0);
    let mut report = build_report(
        args,
        per_cn,
        crashed.len(),
        crash_at,
        crash_again,
        &events,
        &series.borrow(),
        steals,
        (
            &history.borrow(),
            &*deployment,
            &workload,
            committed_delta,
            scan,
        ),
    );
    report.restarted_committed = restarted_committed.get();
    report.protocol = name;
    Ok(report)
}

/// The run's end: its history, the deployment (for final reads), the workload, the
/// committed-balance delta of recovered transactions, and the cost of a whole-store scan.
type Final<'a> = (
    &'a History,
    &'a dyn Deployment,
    &'a AnyWorkload,
    i64,
    (u64, u64),
);

#[allow(clippy::too_many_arguments)]
fn build_report(
    args: &Args,
    per_cn: u32,
    crashed: usize,
    crash_at: Nanos,
    crash_again: Option<Nanos>,
    all_events: &[RecoveryEvent],
    series: &[u64],
    steals: u64,
    (history, deployment, workload, committed_delta, scan): Final<'_>,
) -> Report {
    let us = |ns: Nanos| ns as f64 / 1e3;
    // With a second crash, the figures below are the first crash's recovery.
    let (events, second): (Vec<RecoveryEvent>, Vec<RecoveryEvent>) = all_events
        .iter()
        .cloned()
        .partition(|e| crash_again.is_none_or(|at| e.detected_at < at));
    let events = &events[..];
    let second_recovery_latency_us = second
        .iter()
        .map(|e| e.finished_at)
        .max()
        .zip(second.iter().map(|e| e.detected_at).min())
        .map(|(end, start)| us(end - start));
    let first_detect = events
        .iter()
        .map(|e| e.detected_at)
        .min()
        .unwrap_or(crash_at);
    let last_done = events
        .iter()
        .map(|e| e.finished_at)
        .max()
        .unwrap_or(first_detect);
    let sum = |f: fn(&RecoveryEvent) -> Nanos| events.iter().map(f).sum::<Nanos>();
    let recs: Vec<_> = events.iter().flat_map(|e| &e.coordinators).collect();
    let decided = |d: Decision| recs.iter().filter(|r| r.decision == Some(d)).count();
    let crash_ms = usize::try_from(crash_at / 1_000_000).unwrap_or(usize::MAX);
    let after_ms = usize::try_from(last_done.div_ceil(1_000_000)).unwrap_or(usize::MAX);
    let mean = |s: &[u64]| {
        if s.is_empty() {
            0.0
        } else {
            s.iter().sum::<u64>() as f64 / s.len() as f64
        }
    };
    // Skip the first ms (coordinators start cold) when there is more before the crash.
    let before = series.get(usize::from(crash_ms > 1)..crash_ms.min(series.len()));
    let after = series.get(after_ms.min(series.len())..);

    let (checker, checked_txns) = if args.no_check {
        ("skipped".to_string(), 0)
    } else {
        (verdict(history), history.txns.len())
    };
    // Stray locks of not-logged transactions stay until a survivor steals them (PILL); the
    // deployment reads the final state past them, as a PILL reader would.
    let violations = workload.check(
        |table, key| deployment.read_final(table, key),
        committed_delta,
    );
    let invariants = dmem_harness::invariants_verdict(&violations);
    Report {
        // `measure_report` names the deployed protocol (with its restart switch).
        protocol: args.protocol.clone(),
        workload: args.workload.name().to_string(),
        scale: args.scale.name().to_string(),
        crash: match (args.crash_cns, args.crash) {
            (Some(n), _) => format!("{n} cns"),
            (None, Crash::OneCn) => "cn".to_string(),
            (None, Crash::Half) => "half".to_string(),
        },
        cns: args.cns,
        crashed_cns: crashed as u16,
        coordinators_per_cn: per_cn,
        crash_at_us: us(crash_at),
        detect_timeout_us: args.detect_timeout_us,
        detection_us: us(first_detect.saturating_sub(crash_at)),
        recovery_latency_us: us(last_done - first_detect),
        terminate_us: us(sum(|e| e.terminated_at - e.detected_at)),
        log_recovery_us: us(sum(|e| e.logs_recovered_at - e.terminated_at)),
        scan_us: us(sum(|e| e.finished_at - e.logs_recovered_at)),
        recovered_txns: recs.iter().filter(|r| r.decision.is_some()).count(),
        rolled_forward: decided(Decision::RollForward),
        rolled_back: decided(Decision::RollBack),
        in_flight_txns: recs
            .iter()
            .filter(|r| r.decision.is_some() && (r.restored > 0 || r.unlocked > 0))
            .count(),
        restored_replicas: recs.iter().map(|r| r.restored).sum(),
        released_locks: recs.iter().map(|r| r.unlocked).sum(),
        scanned_locks: events.iter().map(|e| e.scanned_locks).sum(),
        records: workload.tables().iter().map(|t| t.expected_records).sum(),
        scan_reads: scan.0,
        scan_bytes: scan.1,
        steals,
        restarted_cns: deployment.counter("cn_restarts").unwrap_or(0),
        restart_serves_locks: deployment.counter("lotus_restart_grants_after").is_some(),
        serving_again_us: deployment
            .counter("cn_serving_again_at_ns")
            .map(|t| us(t.saturating_sub(crash_at))),
        early_broadcasts: deployment
            .counter("lotus_restart_early_broadcasts")
            .unwrap_or(0),
        restart_grants_before_recovered: deployment
            .counter("lotus_restart_grants_before_recovered")
            .unwrap_or(0),
        restart_grants_after: deployment
            .counter("lotus_restart_grants_after")
            .unwrap_or(0),
        restarted_coordinators: deployment.counter("restarted_coordinators").unwrap_or(0),
        restarted_committed: 0,
        stale_fences: deployment.counter("lotus_stale_fences").unwrap_or(0),
        second_crash_recovered: second.len(),
        second_recovered_txns: second
            .iter()
            .flat_map(|e| &e.coordinators)
            .filter(|r| r.decision.is_some())
            .count(),
        second_recovery_latency_us,
        series: series.to_vec(),
        before_per_ms: before.map_or(0.0, mean),
        after_per_ms: after.map_or(0.0, mean),
        committed: series.iter().sum(),
        checker,
        checked_txns,
        in_doubt: history
            .txns
            .iter()
            .filter(|t| t.outcome == TxnOutcome::Unknown)
            .count(),
        invariants,
    }
}

fn print_report(args: &Args, r: &Report) -> anyhow::Result<()> {
    if args.json {
        return Ok(());
    }
    println!(
        "dmem recover  {} on {} ({} scale)  sim {}  {} MN  {} CN x {} threads x {} coroutines (+1 CN: detector, recovery)  crash {} of {} CN at {} ms  timeout {} µs  seed {}",
        r.protocol,
        r.workload,
        r.scale,
        args.profile,
        args.mns,
        args.cns,
        args.threads,
        args.coroutines,
        r.crashed_cns,
        r.cns,
        args.crash_at_ms,
        r.detect_timeout_us,
        args.seed
    );
    println!(
        "detection          {:>10.1} µs  (crash → suspected)",
        r.detection_us
    );
    println!(
        "recovery latency   {:>10.1} µs  (suspected → all stray transactions decided{})",
        r.recovery_latency_us,
        if r.scanned_locks > 0 || r.protocol == "ford" {
            ", store scanned"
        } else {
            ""
        }
    );
    println!(
        "  termination {:.1} µs, log recovery {:.1} µs, scan + notification {:.1} µs",
        r.terminate_us, r.log_recovery_us, r.scan_us
    );
    println!(
        "recovered txns     {} ({} rolled forward, {} rolled back; {} caught in flight), {} replicas restored, {} locks released, {} scanned locks released, {} stolen later",
        r.recovered_txns,
        r.rolled_forward,
        r.rolled_back,
        r.in_flight_txns,
        r.restored_replicas,
        r.released_locks,
        r.scanned_locks,
        r.steals
    );
    if let Some(serving) = r.serving_again_us {
        let grants = if r.restart_serves_locks {
            format!(
                "; {} locks granted by them since ({} before their recovery ended, {} early broadcasts)",
                r.restart_grants_after, r.restart_grants_before_recovered, r.early_broadcasts
            )
        } else {
            String::new()
        };
        println!(
            "restart            {} restarts; serving again {serving:.1} µs after the crash{grants}",
            r.restarted_cns,
        );
        println!(
            "restarted coords   {} coordinators ran again on them, {} transactions committed",
            r.restarted_coordinators, r.restarted_committed
        );
    }
    if let Some(latency) = r.second_recovery_latency_us {
        println!(
            "second crash       {} CNs recovered again, recovery latency {latency:.1} µs, {} in-flight transactions decided",
            r.second_crash_recovered, r.second_recovered_txns
        );
    }
    println!(
        "store              {} records; a full scan is {} READs of {:.1} MiB",
        r.records,
        r.scan_reads,
        r.scan_bytes as f64 / (1 << 20) as f64
    );
    println!(
        "throughput         {:.1} committed/ms before the crash, {:.1} after recovery",
        r.before_per_ms, r.after_per_ms
    );
    println!("committed per ms:");
    for (row, chunk) in r.series.chunks(10).enumerate() {
        let cells: Vec<String> = chunk.iter().map(|c| format!("{c:>6}")).collect();
        println!("  {:>5} ms {}", row * 10, cells.join(""));
    }
    println!(
        "checker {} ({} txns, {} in doubt)  invariants {}",
        r.checker, r.checked_txns, r.in_doubt, r.invariants
    );
    Ok(())
}

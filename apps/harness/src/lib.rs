//! The closed-loop workload runner shared by `dmem bench` and the tests.
//!
//! [`run_bench`] deploys any [`Protocol`] (see `dmem-deploy`) for a workload on the
//! simulated cluster, loads the workload's data set out of band, runs one closed loop per
//! coordinator (each with its own generator; protocol aborts retried with the same
//! parameters by [`execute_with_reasons`], after the run's [`Backoff`]), warms up for 10 % of the measured time, and
//! reports throughput, abort rate, latency percentiles (hdrhistogram), MN work requests per
//! committed transaction by verb, MN NIC busy fraction, round trips per committed transaction
//! by type, the history checker's verdict over the whole history and the workload's
//! invariants over the final state read with [`Deployment::read_final`](dmem_deploy::Deployment::read_final).
//!
//! # Round trips
//!
//! Each coordinator runs on its own [`SimContext`], which counts the post lists issued
//! through it ([`SimContext::posts`]); the runner wraps every coordinator in [`Rounds`],
//! which snapshots that count when a transaction begins. When
//! [`execute`](dmem_workloads::execute) returns a commit, the difference is the number of
//! post lists the committed attempt awaited (one post list = one round trip to the MNs,
//! whatever number of MNs it spans). Messages (RPCs, LOTUS's lock requests) are not round
//! trips to the MNs; they are counted separately ([`BenchResult::msgs_per_txn`]).
//!
//! # Whole runs checked in bounded memory
//!
//! Without [`BenchConfig::check`] nothing is recorded. With it and a
//! [`BenchConfig::check_segment`] of `s` ns, the history is checked in segments of `s` ns of
//! virtual time: at each multiple of `s` the **gate** cuts it at a quiescent point (the first
//! client to start a transaction past the cut waits, the others wait as they finish their
//! transaction in flight, and when all wait, no transaction is in flight), the segment's
//! transactions go to a [`SegmentedCheck`], which checks them against the frontier carried
//! from earlier segments and keeps only that frontier (per record its latest committed
//! installer), and all go on. Every transaction of the run is checked; memory is bounded by
//! one segment's history plus one carried write per record, not by the run's length (see
//! [`SegmentedCheck`] for what a cut guarantees). Each cut pauses the clients for as long as
//! the longest transaction in flight. Without a segment the whole history is kept and
//! checked once at the end.
//!
//! # Routing
//!
//! A deployment with a [`Router`](dmem_deploy::Router) (LOTUS §4.3) gets its transactions
//! placed: each coordinator keeps one client that generates a transaction, asks the router
//! for a CN and queues it there; the CN's coordinators serve their queue in arrival order
//! and hand the result back. Latency then includes the wait in the queue.
#![forbid(unsafe_code)]

pub mod backoff;
pub mod fabric;
pub mod servers;

pub use backoff::{Backoff, BackoffPause, BadBackoff};

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Poll, Waker};

use dmem_deploy::{
    ClusterShape, DeployError, DeploySpec, Deployed, Protocol, TableDemand, deploy_loaded,
};
use dmem_layout::mix::splitmix64;
use dmem_sim::{SimContext, SimError};
use dmem_txn::MicroOp;
use dmem_txn::{
    AppendTxn, BoxCoordinator, BoxTransaction, CheckOptions, Coordinator, CoordinatorId, History,
    Isolation, Key, Report, SegmentedCheck, TxnError, TxnId, TxnKind, TxnOutcome, check_append,
    check_with,
};
use dmem_verbs::{Clock, Nanos, OpKind};
use dmem_workloads::append::{self, AppendLog, ListError};
use dmem_workloads::{
    AnyWorkload, Executed, Outcome, Pause, TxnGenerator, TxnInfo, TxnSpec, Workload, execute_noting,
};
use hdrhistogram::Histogram;

/// Why a run could not be made (a failed check is a result, not an error).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// The protocol could not be deployed or driven.
    #[error(transparent)]
    Deploy(#[from] DeployError),
    /// The simulator refused a context.
    #[error("simulator: {0}")]
    Sim(#[from] SimError),
    /// A bad run configuration.
    #[error("bad run configuration: {0}")]
    Config(&'static str),
}

/// The tables of `workload` as a protocol-neutral [`DeploySpec`] for `coordinators`
/// coordinators.
#[must_use]
pub fn deploy_spec<W: Workload>(workload: &W, coordinators: u16) -> DeploySpec {
    let mut spec = DeploySpec::new(
        workload
            .tables()
            .iter()
            .map(|t| TableDemand {
                id: t.id,
                value_len: t.value_size,
                expected_records: t.expected_records,
                grows: t.grows,
            })
            .collect(),
        coordinators,
    );
    spec.workload = Some(workload.name().to_owned());
    spec.critical_fields = workload
        .tables()
        .iter()
        .filter_map(|t| workload.critical_field(t.id).map(|f| (t.id, f)))
        .collect();
    spec.key_spaces = workload
        .tables()
        .iter()
        .filter_map(|t| workload.key_space(t.id).map(|k| (t.id, k)))
        .collect();
    spec.write_sets = workload.write_sets();
    spec
}

/// Tries before a transaction is given up (retries reuse its parameters): the default of
/// [`BenchConfig::max_attempts`].
pub const MAX_ATTEMPTS: u32 = 64;

/// [`deploy_spec`] for the run `cfg`, with each growing table's insert room
/// ([`DeploySpec::insert_room`]) sized from the run: at most
/// [`attempts_bound`](BenchConfig::attempts_bound) attempts, each inserting at most the
/// workload's [`inserts_per_txn`](Workload::inserts_per_txn) on average. Tables whose rate
/// the workload does not give keep the default room.
///
/// # Errors
/// [`HarnessError::Config`] for too many coordinators.
pub fn run_spec<W: Workload>(workload: &W, cfg: &BenchConfig) -> Result<DeploySpec, HarnessError> {
    let mut spec = deploy_spec(workload, cfg.coordinators()?);
    spec.warm_cache = cfg.warm_cache;
    let attempts = cfg.attempts_bound()?;
    spec.insert_room = workload
        .tables()
        .iter()
        .filter(|t| t.grows)
        .filter_map(|t| {
            let rate = workload.inserts_per_txn(t.id)?;
            // Rounded up, saturating: a room past 2^64 records is refused when laid out.
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                clippy::cast_precision_loss,
                reason = "a non-negative bound, saturating at u64::MAX"
            )]
            let inserts = (attempts as f64 * rate).ceil() as u64;
            Some((t.id, inserts))
        })
        .collect();
    Ok(spec)
}

/// One closed-loop run.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// The cluster (every CN runs coordinators).
    pub shape: ClusterShape,
    /// Coroutines (coordinators) per thread.
    pub coroutines: u16,
    /// Measured virtual time, ns (after a warm-up of a tenth of it).
    pub duration: Nanos,
    /// Seed of every coordinator's generator (xored with its id).
    pub seed: u64,
    /// Whether to run the history checker.
    pub check: bool,
    /// Whether CNs start with a warm address cache.
    pub warm_cache: bool,
    /// With [`check`](Self::check): check the history in segments of this much virtual
    /// time, cut at quiescent points (every client pauses at a cut until no transaction is
    /// in flight; see the crate docs, "Whole runs checked in bounded memory"). `None`: the
    /// whole history is kept and checked at the end.
    pub check_segment: Option<Nanos>,
    /// Tries per transaction before it is given up (at least 1). [`MAX_ATTEMPTS`] retries
    /// an aborted transaction at once with its parameters, as the harness always did; 1
    /// drops it and the coordinator draws a new transaction, as OOCC's artifact runs its
    /// benchmarks (throughput counts commits either way).
    pub max_attempts: u32,
    /// The wait before each retry ([`Backoff::None`]: at once, the default), drawn per
    /// coordinator from the run's seed and slept on the coordinator's clock.
    pub backoff: Backoff,
}

impl BenchConfig {
    /// Coordinators of the run: CNs × threads × coroutines.
    ///
    /// # Errors
    /// [`HarnessError::Config`] if they exceed the 16-bit coordinator ids.
    pub fn coordinators(&self) -> Result<u16, HarnessError> {
        let n =
            u32::from(self.shape.cns) * u32::from(self.shape.threads) * u32::from(self.coroutines);
        u16::try_from(n)
            .ok()
            .filter(|&n| n < u16::MAX)
            .ok_or(HarnessError::Config(
                "coordinators exceed the 16-bit coordinator ids",
            ))
    }

    /// Attempts the whole run can start at most: every coordinator starts one attempt per
    /// round trip (`2 × one_way_latency_ns` of the profile; no attempt ends sooner, it
    /// posts before it can commit) until the end of the run (warm-up included), then
    /// finishes its last transaction in at most [`max_attempts`](Self::max_attempts)
    /// tries.
    ///
    /// # Errors
    /// [`HarnessError::Config`] for too many coordinators.
    pub fn attempts_bound(&self) -> Result<u64, HarnessError> {
        let round_trip = (2 * self.shape.profile.one_way_latency_ns).max(1);
        let run = self.duration / 10 + self.duration;
        let per_coordinator = run
            .div_ceil(round_trip)
            .saturating_add(u64::from(self.max_attempts.max(1)));
        Ok(u64::from(self.coordinators()?).saturating_mul(per_coordinator))
    }
}

/// What a run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchResult {
    /// Committed transactions per second of virtual time, millions.
    pub mtps: f64,
    /// Aborted attempts / all attempts (a given-up transaction's last try is aborted too).
    pub abort_rate: f64,
    /// Median latency of a committed transaction (first begin to commit), µs.
    pub p50_us: f64,
    /// 99th-percentile latency, µs.
    pub p99_us: f64,
    /// MN work requests per committed transaction: READ, WRITE, CAS, FAA.
    pub mn_per_txn: [f64; 4],
    /// Busiest MN NIC resource's busy fraction.
    pub mn_nic_busy: f64,
    /// Committed transactions (measured).
    pub committed: u64,
    /// Transactions the workload rolled back (measured).
    pub rolled_back: u64,
    /// Transactions given up (measured).
    pub failed: u64,
    /// Mean round trips (post lists) of a committed transaction, per transaction type name
    /// and under `all`.
    pub rtts_per_txn: BTreeMap<String, f64>,
    /// The checker's verdict: "ok", "skipped", or the first anomaly.
    pub checker: String,
    /// With the list-append workload and a checked run: the append checker's verdict
    /// ([`append_verdict`]), which judges the values observed alone.
    pub append_checker: Option<String>,
    /// Transactions in the checked history.
    pub checked_txns: usize,
    /// Transactions whose outcome stayed unknown.
    pub in_doubt: usize,
    /// The invariants' verdict: "ok" or the first violation.
    pub invariants: String,
    /// Committed read-only transactions (measured) and, of those, the ones that took no
    /// round trip beyond their execution rounds (no validation round): one round trip for
    /// a read-only transaction of one round (OOCC §VIII's "commit in one RTT").
    pub ro_committed: u64,
    /// See [`ro_committed`](Self::ro_committed).
    pub ro_no_validation: u64,
    /// Share of the CNs' cores' time spent on charged CPU work (posting, completions,
    /// received messages, protocol work such as LOTUS's lock operations), measured.
    pub cn_cpu_busy: f64,
    /// Two-sided messages the CNs received per committed transaction (LOTUS's lock RPCs).
    pub msgs_per_txn: f64,
    /// For a protocol that batches RPCs into packets (its deployment's `packets`,
    /// `messages` and `packet_bytes` counters, over the whole run): messages per packet
    /// and mean packet payload, bytes.
    pub packets: Option<(f64, f64)>,
    /// The deployment's counters of [`REPORTED_COUNTERS`] that it has (over the whole run,
    /// after the transactions in flight finished), and with a [`BenchConfig::backoff`]
    /// other than none the harness's own `backoff_wait_ns`: the coordinators' backoff
    /// sleeps summed over the whole run.
    pub counters: BTreeMap<String, u64>,
    /// Failed attempts of the measured transactions by reason (a protocol's abort reason,
    /// else the error), aborts of committed transactions' earlier tries included.
    pub errors: BTreeMap<String, u64>,
    /// Committed transactions (measured) per transaction type name: with
    /// [`BenchConfig::max_attempts`] 1 the committed mix drifts from the generated one
    /// towards the types that abort least.
    pub committed_per_type: BTreeMap<String, u64>,
}

/// Deployment counters a [`BenchResult`] reports when the deployment has them: LOTUS's
/// resharding (§4.3) hand-overs, their service interruption, and the lock-state entries
/// still held once the run is quiescent (a lost lock if not 0), its lock requests refused by
/// reason (conflict, full bucket, reader overflow) and the refusals its coordinators met by
/// what the lock was for (a table's records, index buckets, a remote request of several;
/// only those with some); Dandelion's RPC
/// reliability (requests re-sent, stale responses ignored, replies replayed for
/// duplicates, duplicates dropped: all 0 on a run without message faults); the OCC family's
/// writers' total write-wait lease sleep and read-only transactions validated because the
/// lease ran out or an intention lock was met (OOCC §IV).
pub const REPORTED_COUNTERS: &[&str] = &[
    "reshard_handovers",
    "reshard_interruption_mean_ns",
    "reshard_interruption_max_ns",
    "reshard_aborted_holders",
    "reshard_holders_left",
    "lotus_locks_held",
    "lotus_refused_conflict",
    "lotus_refused_bucket_full",
    "lotus_refused_readers",
    "lotus_refused_index_bucket",
    "lotus_refused_mixed_remote",
    "lotus_refused_table_0",
    "lotus_refused_table_1",
    "lotus_refused_table_2",
    "lotus_refused_table_3",
    "lotus_refused_table_4",
    "lotus_refused_table_5",
    "lotus_refused_table_6",
    "lotus_refused_table_7",
    "lotus_refused_table_8",
    "lotus_refused_table_9",
    "lotus_refused_table_10",
    "lotus_refused_table_11",
    "lotus_refused_table_12",
    "lotus_refused_table_13",
    "lotus_refused_table_14",
    "lotus_refused_table_15",
    "retransmissions",
    "stale_responses",
    "replayed_responses",
    "duplicates_dropped",
    "lease_wait_ns",
    "ro_lease_expired",
    "ro_intention",
];

/// A coordinator that notes its context's post-list count when a transaction begins (see
/// the crate docs on round trips).
pub struct Rounds {
    inner: BoxCoordinator,
    ctx: SimContext,
    at_begin: Rc<Cell<u64>>,
    /// Rounds the workload asked for in the current transaction.
    asked: Rc<Cell<u64>>,
    /// With the list-append workload: where each attempt's observed values go.
    recorder: Option<Recorder>,
}

/// Records what each attempt of one coordinator observed through the transaction API
/// (values read and written, begin, end, outcome) into the list-append workload's log
/// ([`AppendLog`]): the append checker's only input.
struct Recorder {
    log: AppendLog,
    coordinator: u16,
    seq: Cell<u64>,
}

/// One attempt being recorded.
struct Attempt {
    log: AppendLog,
    ctx: SimContext,
    id: TxnId,
    begin: Nanos,
    /// Its accesses as micro-ops (decoded as they happen, so no value is kept), or the
    /// first malformed record.
    ops: RefCell<Result<Vec<MicroOp>, (u64, ListError)>>,
}

impl Attempt {
    fn note(&self, op: Result<MicroOp, (u64, ListError)>) {
        let mut ops = self.ops.borrow_mut();
        if let Ok(list) = &mut *ops {
            match op {
                Ok(op) => list.push(op),
                Err(e) => *ops = Err(e),
            }
        }
    }

    fn read(&self, key: Key, value: &Option<Vec<u8>>) {
        self.note(append::read_op(key.0, value.as_deref()));
    }

    fn finish(&self, outcome: TxnOutcome) {
        let txn = AppendTxn {
            id: self.id,
            begin: self.begin,
            end: self.ctx.now(),
            outcome,
            ops: Vec::new(),
        };
        let ops = self.ops.replace(Ok(Vec::new()));
        self.log.record_ops(txn, ops);
    }
}

impl Rounds {
    /// Wraps `inner`, which runs on `ctx` (or a clone of it).
    #[must_use]
    pub fn new(inner: BoxCoordinator, ctx: SimContext) -> Self {
        Self {
            inner,
            ctx,
            at_begin: Rc::new(Cell::new(0)),
            asked: Rc::new(Cell::new(0)),
            recorder: None,
        }
    }

    /// Records every attempt's observed values into `log` as coordinator `coordinator`
    /// (the list-append workload's side log).
    #[must_use]
    pub fn recording(mut self, log: AppendLog, coordinator: u16) -> Self {
        self.recorder = Some(Recorder {
            log,
            coordinator,
            seq: Cell::new(0),
        });
        self
    }

    /// Rounds (reads, read rounds) the workload issued since the last transaction began.
    #[must_use]
    pub fn asked_since_begin(&self) -> u64 {
        self.asked.get()
    }

    /// Round trips so far: the coordinator's own count if it keeps one (two-sided
    /// protocols), else the post lists its context awaited.
    fn round_trips(&self) -> u64 {
        self.inner.round_trips().unwrap_or_else(|| self.ctx.posts())
    }

    /// Round trips since the last transaction began.
    #[must_use]
    pub fn since_begin(&self) -> u64 {
        self.round_trips() - self.at_begin.get()
    }
}

impl Coordinator for Rounds {
    type Txn<'a> = BoxTransaction<'a>;

    async fn begin(&mut self, kind: TxnKind) -> Result<BoxTransaction<'_>, TxnError> {
        self.at_begin.set(self.round_trips());
        self.asked.set(0);
        let attempt = self.recorder.as_ref().map(|r| {
            r.seq.set(r.seq.get() + 1);
            Attempt {
                log: r.log.clone(),
                ctx: self.ctx.clone(),
                id: TxnId {
                    coordinator: CoordinatorId(u32::from(r.coordinator)),
                    seq: r.seq.get(),
                },
                begin: self.ctx.now(),
                ops: RefCell::new(Ok(Vec::new())),
            }
        });
        let inner = self.inner.begin(kind).await?;
        Ok(Box::new(Asked {
            inner,
            asked: Rc::clone(&self.asked),
            attempt,
        }))
    }
}

/// A transaction that counts the rounds its workload issues (for [`Rounds`]).
struct Asked<'a> {
    inner: BoxTransaction<'a>,
    asked: Rc<Cell<u64>>,
    attempt: Option<Attempt>,
}

impl Asked<'_> {
    fn ask(&self) {
        self.asked.set(self.asked.get() + 1);
    }
}

impl dmem_txn::Transaction for Asked<'_> {
    async fn read_round(
        &mut self,
        reqs: &[dmem_txn::ReadReq],
    ) -> Result<dmem_txn::RoundValues, TxnError> {
        self.ask();
        let values = self.inner.read_round(reqs).await?;
        if let Some(a) = &self.attempt {
            for (r, v) in reqs.iter().zip(&values) {
                a.read(r.key, v);
            }
        }
        Ok(values)
    }
    async fn read(
        &mut self,
        table: dmem_txn::TableId,
        key: dmem_txn::Key,
    ) -> Result<Option<Vec<u8>>, TxnError> {
        self.ask();
        let value = self.inner.read(table, key).await?;
        if let Some(a) = &self.attempt {
            a.read(key, &value);
        }
        Ok(value)
    }
    async fn read_for_update(
        &mut self,
        table: dmem_txn::TableId,
        key: dmem_txn::Key,
    ) -> Result<Option<Vec<u8>>, TxnError> {
        self.ask();
        let value = self.inner.read_for_update(table, key).await?;
        if let Some(a) = &self.attempt {
            a.read(key, &value);
        }
        Ok(value)
    }
    async fn write(
        &mut self,
        table: dmem_txn::TableId,
        key: dmem_txn::Key,
        value: &[u8],
    ) -> Result<(), TxnError> {
        self.inner.write(table, key, value).await?;
        if let Some(a) = &self.attempt {
            a.note(append::write_op(key.0, value));
        }
        Ok(())
    }
    async fn insert(
        &mut self,
        table: dmem_txn::TableId,
        key: dmem_txn::Key,
        value: &[u8],
    ) -> Result<(), TxnError> {
        self.inner.insert(table, key, value).await
    }
    async fn delete(
        &mut self,
        table: dmem_txn::TableId,
        key: dmem_txn::Key,
    ) -> Result<(), TxnError> {
        self.inner.delete(table, key).await
    }
    async fn commit(self) -> Result<(), TxnError> {
        let result = self.inner.commit().await;
        if let Some(a) = &self.attempt {
            a.finish(match &result {
                Ok(()) => TxnOutcome::Committed,
                Err(TxnError::Aborted(_)) => TxnOutcome::Aborted,
                Err(_) => TxnOutcome::Unknown,
            });
        }
        result
    }
    async fn abort(self) {
        self.inner.abort().await;
        if let Some(a) = &self.attempt {
            a.finish(TxnOutcome::Aborted);
        }
    }
}

#[derive(Default)]
struct Tally {
    committed: Cell<u64>,
    rolled_back: Cell<u64>,
    failed: Cell<u64>,
    attempts: Cell<u64>,
    delta: Cell<i64>,
    /// Per transaction type: committed and their round trips.
    rounds: RefCell<Vec<(u64, u64)>>,
    /// Committed read-only transactions, and those without a validation round.
    ro: Cell<(u64, u64)>,
    /// Failed attempts by reason (the protocol's abort reason, else the error).
    errors: RefCell<BTreeMap<String, u64>>,
}

/// Runs `workload` on `protocol` (see the crate docs); `progress` is called with the
/// virtual time reached, about a hundred times.
///
/// # Errors
/// [`HarnessError`] if the protocol cannot be deployed or a context made.
pub fn run_bench(
    protocol: &dyn Protocol,
    workload: &AnyWorkload,
    cfg: &BenchConfig,
    mut progress: impl FnMut(Nanos),
) -> Result<BenchResult, HarnessError> {
    if cfg.duration == 0 || cfg.coroutines == 0 {
        return Err(HarnessError::Config(
            "duration and coroutines must be positive",
        ));
    }
    if cfg.max_attempts == 0 {
        return Err(HarnessError::Config("max_attempts must be at least 1"));
    }
    let spec = run_spec(workload, cfg)?;
    // Nothing is recorded when nothing is checked, so memory stays flat in run length.
    let history = Rc::new(RefCell::new(if cfg.check {
        History::new()
    } else {
        History::discarding()
    }));
    let Deployed {
        sim,
        mut deployment,
        ..
    } = deploy_loaded(protocol, &cfg.shape, &spec, &history, || workload.loader())?;

    let types = workload.txn_types().len();
    let tally = Rc::new(Tally {
        rounds: RefCell::new(vec![(0, 0); types]),
        ..Tally::default()
    });
    let latency = Rc::new(RefCell::new(
        Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("static bounds are valid"),
    ));
    let warm_up_end = cfg.duration / 10;
    let end = warm_up_end + cfg.duration;
    let workload = Rc::new(workload.clone());
    // The list-append workload's side log, when the run is checked (clones share it).
    let append_log = workload.append_log().filter(|_| cfg.check).cloned();
    // Segments counted from the start (warm-up included).
    let segment = cfg.check_segment.filter(|&s| cfg.check && s > 0);
    let clients = usize::from(cfg.coordinators()?);
    let gate = Rc::new(Gate::new(
        segment,
        clients,
        Rc::clone(&history),
        append_log.clone(),
        check_options(protocol.isolation()),
    ));
    let window = Window {
        warm_up_end,
        end,
        tally: Rc::clone(&tally),
        latency: Rc::clone(&latency),
    };
    let router = deployment.router();
    // With a router (LOTUS §4.3), each CN's coordinators serve one queue of routed
    // transactions; every coordinator still has one client that generates and waits.
    let queues: Vec<Rc<JobQueue>> = (0..cfg.shape.cns)
        .map(|_| Rc::new(JobQueue::default()))
        .collect();
    let attempts = cfg.max_attempts;
    let backoff_waited = Rc::new(Cell::new(0));
    let mut id: u16 = 0;
    for cn in 0..cfg.shape.cns {
        for thread in 0..cfg.shape.threads {
            for _ in 0..cfg.coroutines {
                let ctx = sim.context(sim.cn(cn), thread)?;
                let inner = deployment.coordinator(ctx.clone().into(), id)?;
                let mut coordinator = Rounds::new(inner, ctx.clone());
                if let Some(log) = &append_log {
                    coordinator = coordinator.recording(log.clone(), id);
                }
                let mut generator = workload.generator(u32::from(id), cfg.seed ^ u64::from(id));
                let mut pause = BackoffPause::new(
                    cfg.backoff,
                    ctx.clone(),
                    cfg.seed,
                    id,
                    Rc::clone(&backoff_waited),
                );
                let (workload, window) = (Rc::clone(&workload), window.clone());
                let gate = Rc::clone(&gate);
                let clock = ctx.clone();
                match &router {
                    None => sim.spawn(&ctx, async move {
                        while clock.now() < end {
                            gate.pass(clock.now()).await;
                            let txn = generator.next_txn();
                            let start = clock.now();
                            let done =
                                run_one(&workload, &mut coordinator, &txn, attempts, &mut pause)
                                    .await;
                            window.note(&txn, start, clock.now(), done);
                        }
                        gate.leave();
                    }),
                    Some(router) => {
                        let queue = Rc::clone(&queues[usize::from(cn)]);
                        let worker_workload = Rc::clone(&workload);
                        sim.spawn(&ctx, async move {
                            loop {
                                let job = queue.pop().await;
                                let done = run_one(
                                    &worker_workload,
                                    &mut coordinator,
                                    &job.txn,
                                    attempts,
                                    &mut pause,
                                )
                                .await;
                                job.reply.fill(done);
                            }
                        });
                        let (router, queues) = (Rc::clone(router), queues.clone());
                        let mut random = cfg.seed ^ 0x0007_0075 ^ (u64::from(id) << 20);
                        let home = usize::from(cn);
                        sim.spawn(&ctx, async move {
                            while clock.now() < end {
                                gate.pass(clock.now()).await;
                                let txn = generator.next_txn();
                                let start = clock.now();
                                random = splitmix64(random);
                                let target = router
                                    .route(txn.kind(), txn.first_record(), random)
                                    .map_or(home, usize::from)
                                    .min(queues.len() - 1);
                                let reply = Rc::new(Reply::default());
                                queues[target].push(Job {
                                    txn: txn.clone(),
                                    reply: Rc::clone(&reply),
                                });
                                let done = reply.wait().await;
                                window.note(&txn, start, clock.now(), done);
                            }
                            gate.leave();
                        });
                    }
                }
                id += 1;
            }
        }
    }

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
        progress(now);
    }
    let stats = sim.stats();
    let at_warm_up = at_warm_up.unwrap_or_else(|| sim.stats());
    // Let the transactions in flight finish so that the final state is quiescent.
    sim.run_until_idle();

    let committed = tally.committed.get();
    let cns: Vec<_> = stats
        .nodes
        .iter()
        .zip(&at_warm_up.nodes)
        .filter(|(n, _)| n.role == dmem_sim::Role::Compute)
        .collect();
    let cn_cpu: f64 = cns
        .iter()
        .map(|(n, w)| n.cpu_busy_ns.saturating_sub(w.cpu_busy_ns) as f64)
        .sum();
    let msgs: u64 = cns
        .iter()
        .map(|(n, w)| {
            n.nic
                .messages_received
                .saturating_sub(w.nic.messages_received)
        })
        .sum();
    let cores = u64::from(cfg.shape.cns) * u64::from(cfg.shape.threads);
    let per_txn = |kind: OpKind| {
        stats.mn_served_since(&at_warm_up, Some(kind)) as f64 / committed.max(1) as f64
    };
    // The last segment: everything recorded since the last cut.
    let (checker, checked_txns, in_doubt) = if cfg.check {
        let rest = core::mem::take(&mut history.borrow_mut().txns);
        let mut check = gate.check.borrow_mut();
        let _ = check.segment(rest);
        (
            report_line(&check.report()),
            check.checked(),
            check.in_doubt(),
        )
    } else {
        ("skipped".to_owned(), 0, 0)
    };
    let append_checker = append_log.map(|log| {
        if let AnyWorkload::Append(w) = &*workload
            && !log.is_closed()
        {
            // The final state, read after everything ended, as one more committed read.
            let id = TxnId {
                coordinator: CoordinatorId(u32::MAX),
                seq: 0,
            };
            let _ = w.final_reads(|t, k| deployment.read_final(t, k), id, sim.now() + 1);
        }
        append_verdict(&log, protocol.isolation())
    });
    let violations = workload.check(
        |table, key| deployment.read_final(table, key),
        tally.delta.get(),
    );
    let invariants = invariants_verdict(&violations);
    let latency = latency.borrow();
    let attempts = tally.attempts.get();
    // Every attempt that neither committed nor rolled back aborted, the last try of a
    // transaction given up included (with `max_attempts` 1 that is every abort).
    let finished = committed + tally.rolled_back.get();
    let rounds = tally.rounds.borrow();
    let mut rtts_per_txn: BTreeMap<String, f64> = workload
        .txn_types()
        .iter()
        .zip(rounds.iter())
        .filter(|(_, (n, _))| *n > 0)
        .map(|(t, (n, r))| (t.name.to_owned(), *r as f64 / *n as f64))
        .collect();
    let (n, r) = rounds
        .iter()
        .fold((0, 0), |(n, r), (tn, tr)| (n + tn, r + tr));
    rtts_per_txn.insert("all".to_owned(), r as f64 / n.max(1) as f64);
    let committed_per_type = workload
        .txn_types()
        .iter()
        .zip(rounds.iter())
        .map(|(t, (n, _))| (t.name.to_owned(), *n))
        .collect();
    Ok(BenchResult {
        mtps: committed as f64 / cfg.duration as f64 * 1e3,
        abort_rate: attempts.saturating_sub(finished) as f64 / attempts.max(1) as f64,
        p50_us: latency.value_at_quantile(0.5) as f64 / 1e3,
        p99_us: latency.value_at_quantile(0.99) as f64 / 1e3,
        mn_per_txn: [
            per_txn(OpKind::Read),
            per_txn(OpKind::Write),
            per_txn(OpKind::Cas),
            per_txn(OpKind::Faa),
        ],
        mn_nic_busy: stats.mn_busy_fraction_since(&at_warm_up),
        committed,
        rolled_back: tally.rolled_back.get(),
        failed: tally.failed.get(),
        rtts_per_txn,
        checker,
        append_checker,
        checked_txns,
        in_doubt,
        invariants,
        ro_committed: tally.ro.get().0,
        ro_no_validation: tally.ro.get().1,
        cn_cpu_busy: cn_cpu / (cfg.duration as f64 * cores.max(1) as f64),
        msgs_per_txn: msgs as f64 / committed.max(1) as f64,
        packets: match (
            deployment.counter("packets"),
            deployment.counter("messages"),
            deployment.counter("packet_bytes"),
        ) {
            (Some(p), Some(m), Some(b)) if p > 0 => {
                Some((m as f64 / p as f64, b as f64 / p as f64))
            }
            _ => None,
        },
        counters: REPORTED_COUNTERS
            .iter()
            .filter_map(|&n| deployment.counter(n).map(|v| (n.to_owned(), v)))
            .chain(
                (cfg.backoff != Backoff::None)
                    .then(|| ("backoff_wait_ns".to_owned(), backoff_waited.get())),
            )
            .collect(),
        errors: tally.errors.borrow().clone(),
        committed_per_type,
    })
}

/// What one transaction's execution gave: the outcome and its coordinator's round counts.
struct Done {
    executed: Executed,
    /// Post lists the committed attempt awaited.
    rounds: u64,
    /// Rounds the workload asked for.
    asked: u64,
    /// Why each failed attempt failed.
    errors: Vec<String>,
}

/// Why an attempt failed, as the benchmarks' reports count it: the protocol's abort reason
/// ([`TxnError::Aborted`]), else the error.
#[must_use]
pub fn failure_reason(error: &TxnError) -> String {
    match error {
        TxnError::Aborted(why) => why.as_str().to_owned(),
        other => other.to_string(),
    }
}

/// Runs `txn` on `coordinator` with up to `attempts` tries ([`execute_noting`]), waiting
/// `pause` out before each retry (a [`BackoffPause`], or [`dmem_workloads::RetryAtOnce`]):
/// its outcome, and why each failed attempt failed ([`failure_reason`]), the last try of a
/// transaction given up included. The one retry loop of every benchmark that counts aborts
/// by reason (the simulator's [`run_bench`], the real-time [`servers::run_servers`] and
/// [`fabric::ClientTally`], `dmem cn`'s coordinators).
pub async fn execute_with_reasons<W: Workload, C: Coordinator>(
    workload: &W,
    coordinator: &mut C,
    txn: &W::Txn,
    attempts: u32,
    pause: &mut impl Pause,
) -> (Executed, Vec<String>) {
    let mut reasons = Vec::new();
    let executed = execute_noting(workload, coordinator, txn, attempts, pause, |e| {
        reasons.push(failure_reason(e));
    })
    .await;
    (executed, reasons)
}

/// A coordinator that lets its executor's other futures run before every attempt begins:
/// for real-time runs, where coordinators share a cooperative executor with one another
/// and with their process's services (LOTUS's lock servers).
///
/// Without it an attempt that aborts without awaiting anything that is not ready (a LOTUS
/// transaction whose locks are all in its own CN's table, refused because another
/// coordinator of the same executor holds them) is retried at once, again and again,
/// while the holder is never polled: every try is refused and the transaction is given up
/// by the executor's scheduling, not by contention (measured with `dmem cn`:
/// `protocol/lotus/README.md`, "In CN processes"). The simulator's runs do not use it:
/// there every attempt's posts take virtual time.
pub struct YieldingBegin(pub BoxCoordinator);

impl Coordinator for YieldingBegin {
    type Txn<'a> = BoxTransaction<'a>;

    async fn begin(&mut self, kind: TxnKind) -> Result<BoxTransaction<'_>, TxnError> {
        dmem_runtime::yield_now().await;
        self.0.begin(kind).await
    }

    fn round_trips(&self) -> Option<u64> {
        self.0.round_trips()
    }
}

/// Runs `txn` on `coordinator` with up to `attempts` tries ([`execute_with_reasons`]).
async fn run_one(
    workload: &AnyWorkload,
    coordinator: &mut Rounds,
    txn: &TxnSpec,
    attempts: u32,
    pause: &mut impl Pause,
) -> Done {
    let (executed, errors) =
        execute_with_reasons(workload, coordinator, txn, attempts, pause).await;
    Done {
        executed,
        rounds: coordinator.since_begin(),
        asked: coordinator.asked_since_begin(),
        errors,
    }
}

/// The measurement window and where finished transactions are counted.
#[derive(Clone)]
struct Window {
    warm_up_end: Nanos,
    end: Nanos,
    tally: Rc<Tally>,
    latency: Rc<RefCell<Histogram<u64>>>,
}

impl Window {
    /// Counts `txn`, generated at `start` and finished at `finished`.
    fn note(&self, txn: &TxnSpec, start: Nanos, finished: Nanos, done: Done) {
        let tally = &self.tally;
        let attempts = match &done.executed {
            Executed::Committed { attempts, .. }
            | Executed::RolledBack { attempts, .. }
            | Executed::Failed { attempts, .. } => *attempts,
        };
        if let Executed::Committed {
            outcome: Outcome::Commit { delta },
            ..
        } = done.executed
        {
            tally.delta.set(tally.delta.get() + delta);
        }
        if start < self.warm_up_end || finished > self.end {
            return;
        }
        tally
            .attempts
            .set(tally.attempts.get() + u64::from(attempts));
        for e in done.errors {
            *tally.errors.borrow_mut().entry(e).or_default() += 1;
        }
        match done.executed {
            Executed::Committed { .. } => {
                tally.committed.set(tally.committed.get() + 1);
                let _ = self.latency.borrow_mut().record((finished - start).max(1));
                if let Some(r) = tally.rounds.borrow_mut().get_mut(txn.type_index()) {
                    r.0 += 1;
                    r.1 += done.rounds;
                }
                if txn.kind() == TxnKind::ReadOnly {
                    let (n, fast) = tally.ro.get();
                    let no_validation = done.rounds <= done.asked;
                    tally.ro.set((n + 1, fast + u64::from(no_validation)));
                }
            }
            Executed::RolledBack { .. } => {
                tally.rolled_back.set(tally.rolled_back.get() + 1);
            }
            Executed::Failed { .. } => tally.failed.set(tally.failed.get() + 1),
        }
    }
}

/// The cuts between checked segments: once a segment's time is up, the first client to
/// start a transaction waits, and so does every other one, until all of them are between
/// transactions (or done); then the segment's history is checked and dropped (nothing in
/// flight, so every transaction recorded before the cut ended before any recorded after it
/// began: see [`SegmentedCheck`]) and every client goes on. The list-append side log is
/// closed at the first cut.
struct Gate {
    segment: Option<Nanos>,
    next_cut: Cell<Nanos>,
    /// Clients still running.
    active: Cell<usize>,
    /// Clients waiting at the cut.
    arrived: Cell<usize>,
    /// A segment's time is up and the clients are draining.
    closing: Cell<bool>,
    /// Cuts made (a waiting client goes on when it changes).
    cuts: Cell<u64>,
    waiting: RefCell<Vec<Waker>>,
    history: Rc<RefCell<History>>,
    append_log: Option<AppendLog>,
    check: RefCell<SegmentedCheck>,
}

impl Gate {
    fn new(
        segment: Option<Nanos>,
        clients: usize,
        history: Rc<RefCell<History>>,
        append_log: Option<AppendLog>,
        options: CheckOptions,
    ) -> Self {
        Self {
            segment,
            next_cut: Cell::new(segment.unwrap_or(Nanos::MAX)),
            active: Cell::new(clients),
            arrived: Cell::new(0),
            closing: Cell::new(false),
            cuts: Cell::new(0),
            waiting: RefCell::new(Vec::new()),
            history,
            append_log,
            check: RefCell::new(SegmentedCheck::new(options)),
        }
    }

    /// Cuts once every running client waits.
    fn try_cut(&self) {
        if !self.closing.get() || self.arrived.get() < self.active.get() {
            return;
        }
        let txns = core::mem::take(&mut self.history.borrow_mut().txns);
        let _ = self.check.borrow_mut().segment(txns);
        if let Some(log) = &self.append_log {
            log.close();
        }
        self.closing.set(false);
        self.arrived.set(0);
        self.cuts.set(self.cuts.get() + 1);
        let segment = self.segment.unwrap_or(Nanos::MAX);
        self.next_cut
            .set(self.next_cut.get().saturating_add(segment));
        for w in self.waiting.borrow_mut().drain(..) {
            w.wake();
        }
    }

    /// Before a transaction that starts at `now`: waits at a cut for every client.
    async fn pass(&self, now: Nanos) {
        if !self.closing.get() && now < self.next_cut.get() {
            return;
        }
        self.closing.set(true);
        self.arrived.set(self.arrived.get() + 1);
        let cut = self.cuts.get();
        self.try_cut();
        poll_fn(|cx| {
            if self.cuts.get() != cut {
                Poll::Ready(())
            } else {
                self.waiting.borrow_mut().push(cx.waker().clone());
                Poll::Pending
            }
        })
        .await;
    }

    /// A client that stops no longer holds the others back.
    fn leave(&self) {
        self.active.set(self.active.get() - 1);
        self.try_cut();
    }
}

/// A routed transaction waiting in a CN's queue.
struct Job {
    txn: TxnSpec,
    reply: Rc<Reply>,
}

/// Where a routed transaction's result goes back to its client.
#[derive(Default)]
struct Reply {
    done: RefCell<Option<Done>>,
    waker: RefCell<Option<Waker>>,
}

impl Reply {
    fn fill(&self, done: Done) {
        *self.done.borrow_mut() = Some(done);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    async fn wait(&self) -> Done {
        poll_fn(|cx| match self.done.borrow_mut().take() {
            Some(d) => Poll::Ready(d),
            None => {
                *self.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

/// One CN's queue of routed transactions, served by its coordinators in arrival order.
#[derive(Default)]
struct JobQueue {
    jobs: RefCell<VecDeque<Job>>,
    idle: RefCell<Vec<Waker>>,
}

impl JobQueue {
    fn push(&self, job: Job) {
        self.jobs.borrow_mut().push_back(job);
        // Wake every idle coordinator: one takes the job, the others wait again (a wake
        // that finds the queue empty costs nothing in the simulator).
        for w in self.idle.borrow_mut().drain(..) {
            w.wake();
        }
    }

    async fn pop(&self) -> Job {
        poll_fn(|cx| match self.jobs.borrow_mut().pop_front() {
            Some(job) => Poll::Ready(job),
            None => {
                self.idle.borrow_mut().push(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

/// The checker's one-line verdict on `history` under strict serializability: "ok" or the
/// first anomaly.
#[must_use]
pub fn verdict(history: &History) -> String {
    verdict_under(history, Isolation::Serializable)
}

/// The checker's one-line verdict on `history` under `isolation` (strict): "ok" or the
/// first anomaly.
#[must_use]
pub fn verdict_under(history: &History, isolation: Isolation) -> String {
    report_line(&check_with(history, &check_options(isolation)))
}

/// Strict checking under `isolation`, the default anomaly cap.
fn check_options(isolation: Isolation) -> CheckOptions {
    CheckOptions {
        isolation,
        ..CheckOptions::default()
    }
}

/// A report's one-line verdict: "ok", or how many anomalies and the first.
#[must_use]
pub fn report_line(report: &Report) -> String {
    match report.anomalies.first() {
        None if report.is_ok() => "ok".to_owned(),
        None => format!("{} anomalies", report.total()),
        Some(first) => format!("{} anomalies, first: {first}", report.total()),
    }
}

/// The checker's verdict on `history` under `isolation` when `check` is on ("skipped"
/// otherwise), with the number of transactions it judged.
#[must_use]
pub fn checked_verdict(history: &History, isolation: Isolation, check: bool) -> (String, usize) {
    if check {
        (verdict_under(history, isolation), history.txns.len())
    } else {
        ("skipped".to_owned(), 0)
    }
}

/// The list-append checker's one-line verdict on what `log` recorded, under `isolation`
/// (strict): "ok", or the malformed records or anomalies and the first of them.
#[must_use]
pub fn append_verdict(log: &AppendLog, isolation: Isolation) -> String {
    log.with(|txns, malformed| {
        if let Some(first) = malformed.first() {
            return format!("{} malformed records, first: {first}", malformed.len());
        }
        let report = check_append(
            txns,
            &CheckOptions {
                isolation,
                ..CheckOptions::default()
            },
        );
        append_report_line(txns, &report)
    })
}

fn append_report_line(txns: &[AppendTxn], report: &dmem_txn::AppendReport) -> String {
    match report.anomalies.first() {
        None if report.is_ok() => "ok".to_owned(),
        None => format!("{} anomalies in {} attempts", report.total(), txns.len()),
        Some(first) => format!("{} anomalies, first: {first}", report.total()),
    }
}

/// The invariants' one-line verdict on a workload's violations: "ok" or how many and the
/// first.
#[must_use]
pub fn invariants_verdict<V: core::fmt::Display>(violations: &[V]) -> String {
    match violations.first() {
        None => "ok".to_owned(),
        Some(v) => format!("{} violations, first: {v}", violations.len()),
    }
}

/// The README's example, compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

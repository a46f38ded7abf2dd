//! One litmus run (cluster, concurrent litmus transactions, crash injection, recovery,
//! assertion, history check) and a suite of runs over many seeds.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

use dmem_deploy::{
    ClusterShape, DeployError, DeploySpec, Deployment, Protocol, RecoveryTiming, TableDemand,
};
use dmem_sim::{MessageFaults, NicProfile, Sim, SimContext};
use dmem_txn::{Coordinator, History, Key, Transaction, TxnError, TxnKind};
use dmem_verbs::{Clock, Nanos, Phase};
use serde::Serialize;

use crate::LitmusError;
use crate::litmus::{self, InstanceKeys, Litmus, Shape, TABLE, VALUE_LEN};
use crate::rng::{SplitMix, mix};

/// The shape of every run. [`RunConfig::new`] gives the defaults the README's numbers use.
#[derive(Debug, Clone, PartialEq)]
pub struct RunConfig {
    /// Probability that a run crashes a worker CN.
    pub crash_prob: f64,
    /// Probability that a crash is aimed at a protocol phase (a phase name the protocol
    /// marked with `Verbs::mark_phase` — log, commit, release, abort, … — or an aborted
    /// attempt that had logged, then an occurrence of it, then a work request at its
    /// boundary or inside its batch; see `crash_point`) rather than at a uniformly chosen
    /// work request. Most work requests of a run
    /// are execution READs where no crash-dependent bug can show; the phases are where
    /// they do (Pandora §5: a crash between logging and committing, inside a commit batch).
    pub targeted: f64,
    /// Probability that an instance's run is steered ([`Steer`]): its two roles either
    /// commit at a common instant or each waits its own delay before every commit, so the
    /// interleavings a bug needs (two commits' batches overlapping, a commit between
    /// another transaction's read and its validation) come up often instead of rarely.
    pub steer: f64,
    /// Commit slot of [`Steer::Aligned`], ns: a steered role waits before its commit until
    /// the next multiple of it, so roles reaching commit within one slot commit together.
    pub commit_slot: Nanos,
    /// Upper bound of [`Steer::Paced`]'s wait before each commit of a role, ns.
    pub max_slow: Nanos,
    /// How the network mistreats two-sided messages (lock RPCs, heartbeats, recovery
    /// notifications, Dandelion's RPCs). By default a share of them is delayed — every
    /// protocol must tolerate a late message; loss and duplication are off here and added
    /// only for a protocol that claims to tolerate them (README).
    pub message_faults: MessageFaults,
    /// Probability that a message is lost in a run of a protocol that claims to tolerate
    /// lost messages (`Protocol::tolerates_message_loss`: LOTUS's RPCs time out), on top
    /// of [`message_faults`](Self::message_faults).
    pub loss_if_tolerated: f64,
    /// Probability that a message is duplicated in a run of a protocol that claims to
    /// tolerate duplicated messages (`Protocol::tolerates_message_duplication`), on top of
    /// [`message_faults`](Self::message_faults).
    pub dup_if_tolerated: f64,
    /// Litmus instances per run, each on its own keys.
    pub instances: u16,
    /// Worker CNs (the litmus roles are spread over them; one more CN runs recovery).
    pub worker_cns: u16,
    /// Upper bound of the random delay before each operation, ns.
    pub max_gap: Nanos,
    /// Upper bound of the random delay before a transaction's first attempt, ns.
    pub max_start: Nanos,
    /// Attempts per litmus transaction before it gives up (aborts are retried).
    pub max_attempts: u32,
    /// How many times each transaction of litmus 1 (and its variants) and 3 commits
    /// (their assertions hold after any serial repetition); litmus 2 runs once.
    pub rounds: u32,
    /// Failure detector timing.
    pub timing: RecoveryTiming,
    /// Virtual time allowed after `timing.until` for the litmus transactions still running
    /// and the assertion transaction to finish. A run that has not finished by then is
    /// reported as *stuck* (a violation: a lock held forever, a request waited for
    /// forever) instead of being simulated without end.
    pub settle: Nanos,
    /// Whether a live CN cut off the fabric (a false suspicion of a heartbeat detector
    /// whose timing is set to suspect live CNs) is accepted as the availability it costs
    /// rather than reported; the assertion and the checker still judge the run. Off by
    /// default: with the suite's timing a live CN must never be suspected.
    pub live_cut_off_allowed: bool,
}

impl RunConfig {
    /// Two instances on two worker CNs (3 MNs, a third CN for recovery), delays up to
    /// 3 µs per operation, 0.9 of the crashes aimed at phases, 0.9 of the instances
    /// steered (20 µs commit slots, paced waits up to 20 µs), 20 % of messages delayed by
    /// 4 µs, heartbeats every 10 µs with a 50 µs timeout, 2 ms of virtual time. The
    /// suite's default setting is `new(1.0)` (a crash in every run).
    #[must_use]
    pub fn new(crash_prob: f64) -> Self {
        Self {
            crash_prob,
            targeted: 0.9,
            steer: 0.9,
            commit_slot: 20_000,
            max_slow: 20_000,
            message_faults: MessageFaults {
                delay: 0.2,
                delay_ns: 4_000,
                ..MessageFaults::default()
            },
            loss_if_tolerated: 0.005,
            dup_if_tolerated: 0.005,
            instances: 2,
            worker_cns: 2,
            max_gap: 3_000,
            max_start: 10_000,
            max_attempts: 64,
            rounds: 3,
            timing: RecoveryTiming {
                heartbeat: 10_000,
                timeout: 50_000,
                poll: 5_000,
                until: 2_000_000,
            },
            settle: 20_000_000,
            live_cut_off_allowed: false,
        }
    }

    /// Checks the configuration.
    ///
    /// # Errors
    /// [`LitmusError::CrashProb`] outside `[0, 1]`, [`LitmusError::Config`] for zero counts.
    pub fn validate(&self) -> Result<(), LitmusError> {
        if !(0.0..=1.0).contains(&self.crash_prob) {
            return Err(LitmusError::CrashProb(self.crash_prob));
        }
        if !(0.0..=1.0).contains(&self.targeted) {
            return Err(LitmusError::Config(
                "the targeted-crash probability must be in [0, 1]",
            ));
        }
        if !(0.0..=1.0).contains(&self.steer) {
            return Err(LitmusError::Config(
                "the steering probability must be in [0, 1]",
            ));
        }
        let f = &self.message_faults;
        if ![
            f.loss,
            f.duplicate,
            f.delay,
            self.loss_if_tolerated,
            self.dup_if_tolerated,
        ]
        .iter()
        .all(|p| (0.0..=1.0).contains(p))
        {
            return Err(LitmusError::Config(
                "message loss, duplication and delay probabilities must be in [0, 1]",
            ));
        }
        if self.steer > 0.0 && (self.commit_slot == 0 || self.max_slow == 0) {
            return Err(LitmusError::Config(
                "steering needs a commit slot and a paced wait bound of at least 1 ns",
            ));
        }
        if self.instances == 0 || self.worker_cns == 0 || self.max_attempts == 0 || self.rounds == 0
        {
            return Err(LitmusError::Config(
                "instances, worker CNs, attempts and rounds must be at least 1",
            ));
        }
        Ok(())
    }
}

/// A crash the run injected: CN `cn` (worker index) at its work request `k`.
///
/// A symmetric protocol's servers (Dandelion) post no work requests: they are crashed at a
/// uniformly chosen instant instead, and `work_request` / `of` are then virtual ns (the
/// crash instant / the instant the last litmus transaction ended without the crash), with
/// `phase` `Some(Phase::Time)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CrashPoint {
    /// Worker CN index.
    pub cn: u16,
    /// Work request index at which it crashed (it and later ones did not land), or the
    /// crash instant for a symmetric protocol.
    pub work_request: u64,
    /// Work requests that CN posted in the same run without the crash, or the instant its
    /// last litmus transaction ended for a symmetric protocol.
    pub of: u64,
    /// The protocol phase the crash was aimed at (`None`: a uniformly chosen work request).
    #[serde(serialize_with = "phase_name")]
    pub phase: Option<Phase>,
}

/// Serializes a crash's phase as its name, as when phases were strings.
fn phase_name<S: serde::Serializer>(phase: &Option<Phase>, s: S) -> Result<S::Ok, S::Error> {
    phase.map(Phase::as_str).serialize(s)
}

/// What a run found wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// One line: the failed assertion, the checker's anomaly or the error.
    pub reason: String,
    /// The checker's full explanation (or the same as `reason`).
    pub detail: String,
}

/// The result of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOutcome {
    /// The litmus.
    pub litmus: Litmus,
    /// The seed.
    pub seed: u64,
    /// The crash injected, if any.
    pub crash: Option<CrashPoint>,
    /// CN failures the protocol recovered.
    pub recoveries: usize,
    /// Litmus transactions that committed.
    pub committed: usize,
    /// `None` if the assertion held and the history checked out.
    pub violation: Option<Violation>,
}

/// How one instance's two roles are steered (schedule steering, drawn per instance from
/// the seed). Pandora §5 runs each litmus many times hoping the racy interleavings occur;
/// steering makes the two that FORD's rare bugs need likely instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Steer {
    /// No steering: the seeded shapes and start instants alone decide the interleaving.
    Free,
    /// Both roles wait before each commit until the next multiple of `slot` ns, so their
    /// commit batches are posted at the same instant and overlap at the MNs (relaxed locks:
    /// each validation READ passes before the other's lock CAS lands).
    Aligned {
        /// The slot, ns.
        slot: Nanos,
    },
    /// Each role waits its own delay before each of its commits, between its reads and
    /// its validation. With unequal delays the faster role's commits fall into the slower
    /// one's read-to-validate window (its validation fails after it logged: lost decision)
    /// and into the window after its abort, while the faster one still has rounds left.
    Paced {
        /// The wait of T1 and of T2 before each commit, ns.
        delays: [Nanos; 2],
    },
}

impl Steer {
    /// Draws an instance's steering: with probability `cfg.steer` a third aligned, two
    /// thirds paced with each role's wait uniform in `[0, cfg.max_slow]`.
    fn draw(rng: &mut SplitMix, cfg: &RunConfig) -> Self {
        if rng.unit() >= cfg.steer {
            return Steer::Free;
        }
        if rng.below(3) == 0 {
            Steer::Aligned {
                slot: cfg.commit_slot,
            }
        } else {
            Steer::Paced {
                delays: [
                    rng.below(cfg.max_slow.saturating_add(1)),
                    rng.below(cfg.max_slow.saturating_add(1)),
                ],
            }
        }
    }

    /// The wait of role `role` before a commit.
    async fn before_commit(self, clock: &SimContext, role: usize) {
        match self {
            Steer::Free => {}
            Steer::Aligned { slot } => {
                let now = clock.now();
                clock.sleep_until((now / slot + 1) * slot).await;
            }
            Steer::Paced { delays } => {
                let delay = delays.get(role).copied().unwrap_or(0);
                if delay > 0 {
                    clock.sleep(delay).await;
                }
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum RoleEnd {
    Committed,
    GaveUp,
    /// The fabric failed under it (its CN crashed or was cut off).
    Fabric,
    Unexpected(String),
}

struct Execution {
    wrs: Vec<u64>,
    /// Per worker CN, the phase marks of the run (recorded when it injects no crash).
    marks: Vec<Vec<(u64, Phase)>>,
    ends: Vec<(u16, RoleEnd)>,
    crashed: Vec<bool>,
    final_state: Result<Vec<Option<u64>>, String>,
    history: History,
    recoveries: usize,
    /// When the last litmus role ended.
    last_end: u64,
}

fn instance_keys(litmus: Litmus, instances: u16) -> Vec<Key> {
    (0..instances)
        .flat_map(|i| InstanceKeys::of(i).first(litmus.key_count()))
        .collect()
}

/// Runs role `role` of one instance: `rounds` transactions, each retried on abort, the
/// first starting at `start`.
#[allow(clippy::too_many_arguments)]
async fn run_role<C: Coordinator>(
    co: &mut C,
    clock: &SimContext,
    litmus: Litmus,
    role: usize,
    keys: InstanceKeys,
    start: Nanos,
    steer: Steer,
    mut rng: SplitMix,
    cfg: &RunConfig,
) -> RoleEnd {
    let rounds = if litmus == Litmus::ReadWrite {
        1
    } else {
        cfg.rounds
    };
    clock.sleep_until(start).await;
    for _ in 0..rounds {
        match run_once(co, clock, litmus, role, keys, steer, &mut rng, cfg).await {
            RoleEnd::Committed => {}
            other => return other,
        }
    }
    RoleEnd::Committed
}

/// One litmus transaction until it commits (or gives up, or its CN fails).
#[allow(clippy::too_many_arguments)]
async fn run_once<C: Coordinator>(
    co: &mut C,
    clock: &SimContext,
    litmus: Litmus,
    role: usize,
    keys: InstanceKeys,
    steer: Steer,
    rng: &mut SplitMix,
    cfg: &RunConfig,
) -> RoleEnd {
    for _ in 0..cfg.max_attempts {
        // Half of the attempts run without delays: with a common start (a litmus7-style
        // barrier) the two roles then reach their commits nearly together.
        let max_gap = if rng.next_u64() & 1 == 0 {
            0
        } else {
            cfg.max_gap
        };
        let shape = Shape::draw(rng, max_gap);
        let res = match co.begin(TxnKind::ReadWrite).await {
            Err(e) => Err(e),
            Ok(mut t) => match litmus::body(litmus, role, keys, shape, &mut t, clock).await {
                Ok(()) => {
                    steer.before_commit(clock, role).await;
                    t.commit().await
                }
                Err(e) => {
                    t.abort().await;
                    Err(e)
                }
            },
        };
        match res {
            Ok(()) => return RoleEnd::Committed,
            Err(e) if e.is_retryable() => {
                clock.sleep(1_000 + rng.below(cfg.max_gap * 4 + 1)).await;
            }
            Err(TxnError::Verbs(_)) => return RoleEnd::Fabric,
            Err(e) => return RoleEnd::Unexpected(e.to_string()),
        }
    }
    RoleEnd::GaveUp
}

/// The assertion transaction: read every key read-only, retrying aborts (a lock still
/// held by a transaction finishing, a stray lock not yet released).
async fn read_final<C: Coordinator>(
    co: &mut C,
    clock: &SimContext,
    keys: &[Key],
) -> Result<Vec<Option<u64>>, String> {
    let mut last = String::new();
    for _ in 0..200 {
        let mut t = match co.begin(TxnKind::ReadOnly).await {
            Ok(t) => t,
            Err(e) => {
                last = e.to_string();
                clock.sleep(10_000).await;
                continue;
            }
        };
        match litmus::read_all(&mut t, keys).await {
            Ok(values) => match t.commit().await {
                Ok(()) => return Ok(values),
                Err(e) => last = e.to_string(),
            },
            Err(e) => {
                t.abort().await;
                last = e.to_string();
            }
        }
        clock.sleep(10_000).await;
    }
    Err(last)
}

/// The records every instance of `litmus` starts with.
fn initial_records(litmus: Litmus, instances: u16) -> Vec<(Key, Vec<u8>)> {
    let mut records = Vec::new();
    for i in 0..instances {
        let keys = InstanceKeys::of(i).first(litmus.key_count());
        for (key, init) in keys.into_iter().zip(litmus.initial()) {
            if let Some(v) = init {
                records.push((key, v.to_le_bytes().to_vec()));
            }
        }
    }
    records
}

/// One table of three records per instance, `coordinators` of them, small logs, an exact
/// index (the suite's records fit, so no slack).
fn litmus_spec(coordinators: u16, instances: u16) -> DeploySpec {
    let mut spec = DeploySpec::new(
        vec![TableDemand {
            id: TABLE,
            value_len: VALUE_LEN,
            expected_records: u64::from(instances) * 3,
            grows: false,
        }],
        coordinators,
    );
    spec.log_region_bytes = 1024;
    spec.index_slack = 1;
    spec.exact_index = true;
    spec
}

/// The suite's cluster: 3 MNs, the worker CNs and one recovery CN of 2 threads each, cx5,
/// with the message faults `cfg` asks for (plus loss or duplication for a protocol that
/// claims to tolerate them).
fn litmus_shape(
    target: &dyn Protocol,
    litmus: Litmus,
    seed: u64,
    cfg: &RunConfig,
) -> Result<ClusterShape, LitmusError> {
    let mut faults = cfg.message_faults;
    if target.tolerates_message_loss() {
        faults.loss = faults.loss.max(cfg.loss_if_tolerated);
    }
    if target.tolerates_message_duplication() {
        faults.duplicate = faults.duplicate.max(cfg.dup_if_tolerated);
    }
    Ok(ClusterShape {
        message_faults: faults,
        mns: 3,
        cns: cfg.worker_cns + 1,
        threads: 2,
        seed: mix(&[seed, litmus as u64, 1]),
        profile: NicProfile::named("cx5").map_err(|_| LitmusError::Config("no cx5 profile"))?,
        min_mn_bytes: 96 << 10,
    })
}

/// How each role's run ended, with its CN.
type Ends = Rc<RefCell<Vec<(u16, RoleEnd)>>>;

/// Spawns both roles of every instance on the worker CNs, each with its own coordinator,
/// start instant and random stream; each pushes its end into `ends` and raises `last_end`.
fn spawn_roles(
    sim: &Rc<Sim>,
    dep: &mut dyn Deployment,
    litmus: Litmus,
    seed: u64,
    cfg: &RunConfig,
    ends: &Ends,
    last_end: &Rc<std::cell::Cell<u64>>,
) -> Result<(), LitmusError> {
    let (roles, workers) = (2u16, cfg.worker_cns);
    let mut rng = SplitMix::new(mix(&[seed, litmus as u64, 2]));
    // Steering has its own stream: with it off, a seed runs as it did before steering.
    let mut steer_rng = SplitMix::new(mix(&[seed, litmus as u64, 4]));
    for i in 0..cfg.instances {
        let steer = Steer::draw(&mut steer_rng, cfg);
        // Half of the instances start both roles at one instant (a barrier), the others
        // at independent instants.
        let common = rng.below(cfg.max_start.max(1));
        let barrier = rng.next_u64() & 1 == 0;
        for role in 0..roles {
            let start = if barrier {
                common
            } else {
                rng.below(cfg.max_start.max(1))
            };
            let id = i * roles + role;
            let cn = (role + i) % workers;
            let ctx = sim.context(sim.cn(cn), 0)?;
            let mut co = dep.coordinator(ctx.clone().into(), id)?;
            let role_rng = SplitMix::new(rng.next_u64());
            let ends = Rc::clone(ends);
            let cfg = cfg.clone();
            let keys = InstanceKeys::of(i);
            let clock = ctx.clone();
            let last_end = Rc::clone(last_end);
            sim.spawn(&ctx, async move {
                let end = run_role(
                    &mut co,
                    &clock,
                    litmus,
                    usize::from(role),
                    keys,
                    start,
                    steer,
                    role_rng,
                    &cfg,
                )
                .await;
                ends.borrow_mut().push((cn, end));
                last_end.set(last_end.get().max(clock.now()));
            });
        }
    }
    Ok(())
}

fn execute(
    target: &dyn Protocol,
    litmus: Litmus,
    seed: u64,
    cfg: &RunConfig,
    crash: Option<(u16, u64)>,
) -> Result<Execution, LitmusError> {
    let workers = cfg.worker_cns;
    let recovery_cn = workers;
    let history = Rc::new(RefCell::new(History::new()));
    let records = initial_records(litmus, cfg.instances);
    let roles = 2u16;
    let spec = litmus_spec(cfg.instances * roles + 1, cfg.instances);
    let shape = litmus_shape(target, litmus, seed, cfg)?;
    let sim = shape.build(target.mn_bytes_per_mn(&spec, shape.mns)?)?;
    sim.record_phases(crash.is_none());
    let mut dep = target.deploy(&sim, &spec, Rc::clone(&history))?;
    for (key, value) in &records {
        dep.load(TABLE, *key, value)?;
    }
    let ends: Ends = Rc::default();
    let last_end = Rc::new(std::cell::Cell::new(0u64));
    spawn_roles(&sim, &mut *dep, litmus, seed, cfg, &ends, &last_end)?;
    if let Some((cn, k)) = crash {
        if target.symmetric() {
            sim.crash_at(sim.cn(cn), k);
        } else {
            sim.crash_at_work_request(sim.cn(cn), k);
        }
    }
    match dep.sim_recovery() {
        Some(recovery) => recovery.start_recovery(&sim, recovery_cn, cfg.timing)?,
        None if crash.is_some() => return Err(DeployError::NoSimRecovery(target.name()).into()),
        None => {}
    }
    sim.run_until(cfg.timing.until);

    let reader_ctx = sim.context(sim.cn(recovery_cn), 0)?;
    let mut reader = dep.final_coordinator(reader_ctx.clone().into(), cfg.instances * roles)?;
    let keys = instance_keys(litmus, cfg.instances);
    let state = Rc::new(RefCell::new(None));
    let s = Rc::clone(&state);
    let clock = reader_ctx.clone();
    sim.spawn(&reader_ctx, async move {
        let r = read_final(&mut reader, &clock, &keys).await;
        *s.borrow_mut() = Some(r);
    });
    // Bounded: a run whose tasks never go idle (a request retransmitted forever to a
    // server nobody declared crashed, say) ends here and is reported as stuck.
    let settle_end = cfg.timing.until.saturating_add(cfg.settle);
    sim.run_until(settle_end);
    let stats = sim.stats();
    let wrs = (0..workers)
        .map(|cn| stats.node(sim.cn(cn)).nic.wrs_posted)
        .collect();
    // Crashed at some point (a restarted CN, LOTUS §6, is up again at the end).
    let crashed = (0..workers).map(|cn| sim.crashes(sim.cn(cn)) > 0).collect();
    let final_state = state.borrow_mut().take().unwrap_or_else(|| {
        Err(format!(
            "stuck: the assertion transaction had not finished {} µs of virtual time after the run",
            cfg.settle / 1_000
        ))
    });
    let ends = ends.borrow().clone();
    let history = history.borrow().clone();
    let marks = (0..workers).map(|cn| sim.phase_marks(sim.cn(cn))).collect();
    Ok(Execution {
        wrs,
        marks,
        ends,
        crashed,
        final_state,
        history,
        recoveries: dep.sim_recovery().map_or(0, |r| r.recovery_events().len()),
        last_end: last_end.get(),
    })
}

fn judge(
    litmus: Litmus,
    cfg: &RunConfig,
    ex: &Execution,
    isolation: dmem_txn::Isolation,
) -> Option<Violation> {
    let one = |reason: String| {
        Some(Violation {
            detail: reason.clone(),
            reason,
        })
    };
    for (cn, end) in &ex.ends {
        if let RoleEnd::Unexpected(e) = end {
            return one(format!("a litmus transaction on CN {cn} failed: {e}"));
        }
        if *end == RoleEnd::Fabric && !ex.crashed[usize::from(*cn)] && !cfg.live_cut_off_allowed {
            return one(format!(
                "a litmus transaction on live CN {cn} lost the fabric"
            ));
        }
    }
    let state = match &ex.final_state {
        Ok(s) => s,
        Err(e) if e.starts_with("stuck") => return one(e.clone()),
        Err(e) => {
            return one(format!(
                "the assertion transaction could not commit (a lock never released?): {e}"
            ));
        }
    };
    let per = litmus.key_count();
    for i in 0..usize::from(cfg.instances) {
        if let Err(why) = litmus.assert_final_under(&state[i * per..(i + 1) * per], isolation) {
            return one(format!("assertion, instance {i}: {why}"));
        }
    }
    let report = dmem_txn::check_with(
        &ex.history,
        &dmem_txn::CheckOptions {
            isolation,
            ..dmem_txn::CheckOptions::default()
        },
    );
    if !report.is_ok() {
        let first = report
            .anomalies
            .first()
            .map_or_else(String::new, |a| a.to_string());
        let line = first.lines().next().unwrap_or_default().to_owned();
        return Some(Violation {
            reason: format!("checker: {line}"),
            detail: report.to_string(),
        });
    }
    None
}

/// How many phase names the aborted logged attempts weigh as in [`crash_point`].
const LOGGED_ABORT_WEIGHT: u64 = 4;

/// Whether a phase is an abort step.
fn is_abort(phase: Phase) -> bool {
    matches!(
        phase,
        Phase::AbortTruncate | Phase::AbortUnlock | Phase::AbortRelease
    )
}

/// Whether a phase's batch carries log WRITEs.
fn is_log(phase: Phase) -> bool {
    matches!(
        phase,
        Phase::Log | Phase::LockLog | Phase::CommitLockAndLog | Phase::ValidateAndLog
    )
}

/// Whether a phase writes a commit's new values.
fn is_commit(phase: Phase) -> bool {
    matches!(phase, Phase::Commit | Phase::CommitWithInsert)
}

/// The aborted logged attempts of a CN's marks: for each abort (the first mark of a run
/// of abort steps) preceded by a log write since the CN's previous commit or abort,
/// `(abort's first work request, next log write's first, end of that log write)` (the
/// run's end if there is none). A crash in between finds what the aborted attempt's log
/// still says when recovery reads it (Pandora §5.1: a log never truncated — lost
/// decision — or written for a lock never held — logging without locking).
fn logged_aborts(marks: &[(u64, Phase)], of: u64) -> Vec<(u64, u64, u64, Phase)> {
    let mut out = Vec::new();
    for i in 0..marks.len() {
        let phase = marks[i].1;
        if !is_abort(phase) || (i > 0 && is_abort(marks[i - 1].1)) {
            continue;
        }
        let logged = marks[..i]
            .iter()
            .rev()
            .take_while(|m| !is_abort(m.1) && !is_commit(m.1))
            .any(|m| is_log(m.1));
        if !logged {
            continue;
        }
        let start = marks[i].0;
        let next = marks[i + 1..]
            .iter()
            .position(|m| is_log(m.1))
            .map(|j| i + 1 + j);
        let next_log = next.map_or(of, |j| marks[j].0).max(start);
        let end = next
            .and_then(|j| marks.get(j + 1))
            .map_or(of, |m| m.0)
            .max(next_log);
        out.push((start, next_log, end, phase));
    }
    out
}

/// Where to crash a CN that posts `of` work requests, given the phase marks `marks` the
/// protocol made in the crash-free run (`(first work request, phase)`).
///
/// With probability `targeted` (and if the protocol marked phases) the crash is aimed:
/// first a *stratum* is chosen uniformly — one per distinct phase name, plus one for "an
/// aborted attempt that had logged" ([`logged_aborts`]) — then one occurrence of it
/// uniformly, then a work request from that occurrence's first one (nothing of it lands)
/// to the first one of the next phase (all of it lands); half of the time strictly inside
/// the batch when it has two work requests or more (a prefix of it lands). Choosing the
/// name first gives a rare phase (a commit batch, an abort's log truncation) as much
/// weight as the execution READs that make up most of a run. Otherwise the work request
/// is uniform over all `of`.
fn crash_point(
    marks: &[(u64, Phase)],
    of: u64,
    targeted: f64,
    rng: &mut SplitMix,
) -> (u64, Option<Phase>) {
    let aimed = rng.unit() < targeted;
    if !aimed || marks.is_empty() {
        return (rng.below(of.max(1)), None);
    }
    let mut names: Vec<Phase> = Vec::new();
    for &(_, name) in marks {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    let aborts = logged_aborts(marks, of);
    // The aborted logged attempts weigh as four phase names: they are what the issue of
    // an aborted attempt's log needs, and runs have few of them.
    let extra = if aborts.is_empty() {
        0
    } else {
        LOGGED_ABORT_WEIGHT
    };
    let stratum = rng.below(names.len() as u64 + extra) as usize;
    if stratum >= names.len() {
        let (start, next_log, end, phase) = aborts[rng.below(aborts.len() as u64) as usize];
        // Right at the abort (its truncation does not land), right before the next log
        // write (the stale log is what recovery reads), or anywhere around them.
        let k = match rng.below(3) {
            0 => start,
            1 => next_log,
            _ => start + rng.below(end - start + 1),
        };
        return (k, Some(phase));
    }
    let name = names[stratum];
    let count = marks.iter().filter(|m| m.1 == name).count() as u64;
    let pick = rng.below(count) as usize;
    let i = marks
        .iter()
        .enumerate()
        .filter(|(_, m)| m.1 == name)
        .nth(pick)
        .map_or(0, |(i, _)| i);
    let start = marks[i].0;
    let end = marks.get(i + 1).map_or(of, |m| m.0).max(start);
    let phase = name;
    let inside = end - start >= 2 && rng.next_u64() & 1 == 0;
    let k = if inside {
        start + 1 + rng.below(end - start - 1)
    } else {
        start + rng.below(end - start + 1)
    };
    (k, Some(phase))
}

/// Runs litmus `litmus` once with seed `seed`: builds the cluster and the target's store,
/// loads the litmus keys, runs two instances of the litmus transactions concurrently with
/// seeded delays, crashes a worker CN with probability `cfg.crash_prob` — at a work request
/// aimed at a protocol phase with probability `cfg.targeted`, else uniformly chosen (its
/// work-request count and phases are taken from the same run without the crash),
/// lets the target's recovery run, then reads the keys in a read-only transaction and
/// checks the litmus assertion (Pandora Fig. 5) and the history (`dmem_txn::check`,
/// strict serializability).
///
/// # Errors
/// [`LitmusError`] if the cluster or the store cannot be built.
pub fn run_one(
    target: &dyn Protocol,
    litmus: Litmus,
    seed: u64,
    cfg: &RunConfig,
) -> Result<RunOutcome, LitmusError> {
    cfg.validate()?;
    let mut rng = SplitMix::new(mix(&[seed, litmus as u64, 3]));
    let crash = if rng.unit() < cfg.crash_prob {
        let cn = rng.below(u64::from(cfg.worker_cns)) as u16;
        let dry = execute(target, litmus, seed, cfg, None)?;
        let (of, (work_request, phase)) = if target.symmetric() {
            // No work requests to count: a uniformly chosen instant of the run.
            let of = dry.last_end;
            (of, (rng.below(of.max(1)), Some(Phase::Time)))
        } else {
            let of = dry.wrs[usize::from(cn)];
            (
                of,
                crash_point(&dry.marks[usize::from(cn)], of, cfg.targeted, &mut rng),
            )
        };
        Some(CrashPoint {
            cn,
            work_request,
            of,
            phase,
        })
    } else {
        None
    };
    let ex = execute(
        target,
        litmus,
        seed,
        cfg,
        crash.map(|c| (c.cn, c.work_request)),
    )?;
    let violation = judge(litmus, cfg, &ex, target.isolation());
    Ok(RunOutcome {
        litmus,
        seed,
        crash,
        recoveries: ex.recoveries,
        committed: ex
            .ends
            .iter()
            .filter(|(_, e)| *e == RoleEnd::Committed)
            .count(),
        violation,
    })
}

/// The first violation of a suite.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Failure {
    /// Litmus name.
    pub litmus: &'static str,
    /// Seed (replay with `--litmus L --first-seed S --seeds 1`).
    pub seed: u64,
    /// One line.
    pub reason: String,
    /// The crash of that run, if any.
    pub crash: Option<CrashPoint>,
    /// The checker's explanation.
    #[serde(skip)]
    pub detail: String,
}

impl Failure {
    fn of(o: &RunOutcome) -> Option<Self> {
        o.violation.as_ref().map(|v| Self {
            litmus: o.litmus.name(),
            seed: o.seed,
            reason: v.reason.clone(),
            crash: o.crash,
            detail: v.detail.clone(),
        })
    }
}

/// Counts of one litmus over a suite.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LitmusSummary {
    /// Litmus name.
    pub litmus: &'static str,
    /// What it checks.
    pub title: &'static str,
    /// Runs.
    pub runs: u64,
    /// Runs with a violation.
    pub violations: u64,
    /// Runs with a crash injected.
    pub crashes: u64,
    /// Runs in which the protocol recovered a failure.
    pub recovered: u64,
    /// Litmus transactions committed.
    pub committed: u64,
    /// Its first failing seed.
    pub first_failure: Option<Failure>,
}

/// A suite's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SuiteReport {
    /// The target's name.
    pub protocol: String,
    /// Total runs.
    pub runs: u64,
    /// Runs with a violation.
    pub violations: u64,
    /// The first failure by (seed, litmus order).
    pub first_failure: Option<Failure>,
    /// Per litmus.
    pub per_litmus: Vec<LitmusSummary>,
    /// Wall time, s.
    pub wall_s: f64,
}

/// What a suite runs.
#[derive(Debug, Clone, PartialEq)]
pub struct SuiteConfig {
    /// Which litmus tests.
    pub litmus: Vec<Litmus>,
    /// First seed.
    pub first_seed: u64,
    /// Seeds per litmus.
    pub seeds: u64,
    /// Per-run shape.
    pub run: RunConfig,
    /// OS threads (runs are independent; results do not depend on it).
    pub threads: usize,
}

/// Runs every litmus of `cfg` over `cfg.seeds` seeds each.
///
/// # Errors
/// [`LitmusError`] for a bad configuration or a run that could not be built.
pub fn run_suite(target: &dyn Protocol, cfg: &SuiteConfig) -> Result<SuiteReport, LitmusError> {
    cfg.run.validate()?;
    if cfg.seeds == 0 {
        return Err(LitmusError::NoSeeds);
    }
    if cfg.litmus.is_empty() {
        return Err(LitmusError::Config("no litmus selected"));
    }
    let started = Instant::now();
    let jobs: Vec<(u64, Litmus)> = (0..cfg.seeds)
        .flat_map(|s| cfg.litmus.iter().map(move |&l| (cfg.first_seed + s, l)))
        .collect();
    let threads = cfg.threads.max(1);
    let mut outcomes: Vec<RunOutcome> = Vec::with_capacity(jobs.len());
    let results: Vec<Result<Vec<RunOutcome>, LitmusError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|w| {
                let jobs = &jobs;
                scope.spawn(move || {
                    jobs.iter()
                        .skip(w)
                        .step_by(threads)
                        .map(|&(seed, l)| run_one(target, l, seed, &cfg.run))
                        .collect::<Result<Vec<_>, _>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(Err(LitmusError::WorkerPanicked)))
            .collect()
    });
    for r in results {
        outcomes.extend(r?);
    }
    let order = |l: Litmus| cfg.litmus.iter().position(|&x| x == l).unwrap_or(0);
    outcomes.sort_by_key(|o| (o.seed, order(o.litmus)));
    let mut per: Vec<LitmusSummary> = cfg
        .litmus
        .iter()
        .map(|l| LitmusSummary {
            litmus: l.name(),
            title: l.title(),
            runs: 0,
            violations: 0,
            crashes: 0,
            recovered: 0,
            committed: 0,
            first_failure: None,
        })
        .collect();
    let mut first_failure = None;
    for o in &outcomes {
        let s = &mut per[order(o.litmus)];
        s.runs += 1;
        s.crashes += u64::from(o.crash.is_some());
        s.recovered += u64::from(o.recoveries > 0);
        s.committed += o.committed as u64;
        if o.violation.is_some() {
            s.violations += 1;
            if s.first_failure.is_none() {
                s.first_failure = Failure::of(o);
            }
            if first_failure.is_none() {
                first_failure = Failure::of(o);
            }
        }
    }
    Ok(SuiteReport {
        protocol: target.name(),
        runs: per.iter().map(|s| s.runs).sum(),
        violations: per.iter().map(|s| s.violations).sum(),
        first_failure,
        per_litmus: per,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

/// Runs seeds `first_seed..first_seed + max_seeds` of each of `litmus` in order (seed
/// by seed) and stops at the first violation: how many seeds a bug needs to show.
///
/// # Errors
/// [`LitmusError`] if a run could not be built.
pub fn first_violation(
    target: &dyn Protocol,
    litmus: &[Litmus],
    first_seed: u64,
    max_seeds: u64,
    cfg: &RunConfig,
) -> Result<Option<RunOutcome>, LitmusError> {
    for seed in first_seed..first_seed + max_seeds {
        for &l in litmus {
            let o = run_one(target, l, seed, cfg)?;
            if o.violation.is_some() {
                return Ok(Some(o));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Marks of one CN: an attempt that logged and aborted, a retry that logs and commits.
    const MARKS: [(u64, Phase); 8] = [
        (0, Phase::Execute),
        (2, Phase::CommitLock),
        (4, Phase::ValidateAndLog),
        (9, Phase::AbortUnlock),
        (11, Phase::Execute),
        (13, Phase::ValidateAndLog),
        (18, Phase::Commit),
        (24, Phase::Release),
    ];

    #[test]
    fn logged_aborts_span_from_the_abort_to_the_next_log_write() {
        assert_eq!(
            logged_aborts(&MARKS, 26),
            vec![(9, 13, 18, Phase::AbortUnlock)]
        );
        // An abort with no log write since the last commit is not a logged one.
        let unlogged = [
            (0, Phase::Execute),
            (2, Phase::CommitLock),
            (4, Phase::AbortUnlock),
        ];
        assert!(logged_aborts(&unlogged, 6).is_empty());
        // Without a later log write the window runs to the end.
        assert_eq!(
            logged_aborts(&MARKS[..5], 12),
            vec![(9, 12, 12, Phase::AbortUnlock)]
        );
    }

    #[test]
    fn aimed_crashes_cover_every_phase_name_and_stay_in_range() {
        let mut rng = SplitMix::new(7);
        let mut seen = std::collections::BTreeSet::new();
        let mut in_window = 0;
        for _ in 0..4000 {
            let (k, phase) = crash_point(&MARKS, 26, 1.0, &mut rng);
            assert!(k <= 26);
            let phase = phase.expect("aimed");
            seen.insert(phase);
            if (9..=18).contains(&k) {
                in_window += 1;
            }
        }
        let names: std::collections::BTreeSet<_> = MARKS.iter().map(|m| m.1).collect();
        assert_eq!(seen, names);
        // The logged abort weighs as four of the six names' strata: far more than the
        // 10 of 27 work requests of its window under uniform placement.
        assert!(
            in_window > 2000,
            "{in_window} of 4000 in the logged abort's window"
        );
        let mut uniform = SplitMix::new(7);
        for _ in 0..100 {
            assert_eq!(crash_point(&MARKS, 26, 0.0, &mut uniform).1, None);
        }
    }

    #[test]
    fn steering_is_drawn_as_configured() {
        let mut cfg = RunConfig::new(1.0);
        let mut rng = SplitMix::new(3);
        cfg.steer = 0.0;
        assert!((0..100).all(|_| Steer::draw(&mut rng, &cfg) == Steer::Free));
        cfg.steer = 1.0;
        let draws: Vec<Steer> = (0..300).map(|_| Steer::draw(&mut rng, &cfg)).collect();
        assert!(draws.iter().all(|s| *s != Steer::Free));
        assert!(
            draws
                .iter()
                .any(|s| matches!(s, Steer::Aligned { slot: 20_000 }))
        );
        assert!(draws.iter().any(|s| match s {
            Steer::Paced { delays } => delays.iter().all(|&d| d <= cfg.max_slow),
            _ => false,
        }));
    }
}

//! Every lock protocol on the simulated cluster: mutual exclusion under high contention
//! over many seeds, liveness (every acquisition completes within a bound, no faults), and
//! DecLock's recovery from a CN that crashes while holding a lock (DecLock §4.4, §6.7), for
//! the client-level queue (`Dec`) and hierarchical locking (§5, `DecTf`, `DecPf`), and
//! that task-fair hierarchical locking orders acquisitions across CNs by timestamp (§5.3).
//!
//! The mutual-exclusion checker is shared by all coroutines (the simulator is
//! single-threaded): at every instant a lock has one exclusive holder or only shared
//! holders. Holders sleep inside their critical section so that others really overlap.
#![allow(missing_docs)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use dmem_locks::caslock::{CasLockClient, CasLockConfig};
use dmem_locks::declock::{DecLockClient, DecLockConfig};
use dmem_locks::dslr::{DslrClient, DslrConfig};
use dmem_locks::local::{FairnessPolicy, LocalLockTable};
use dmem_locks::shiftlock::{ShiftLockClient, ShiftLockConfig};
use dmem_locks::{
    Directory, FailureDetector, LockLayout, LockMode, LockStats, NoFailures, RwLockClient,
};
use dmem_sim::{ClusterConfig, Sim, SimContext};
use dmem_verbs::{Clock, Nanos, NodeId, RemoteAddr, Verbs};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Cas,
    Dslr,
    Shift,
    Dec,
    DecTf,
    DecPf,
}

const ALL: [Kind; 6] = [
    Kind::Cas,
    Kind::Dslr,
    Kind::Shift,
    Kind::Dec,
    Kind::DecTf,
    Kind::DecPf,
];

impl Kind {
    fn is_declock(self) -> bool {
        matches!(self, Kind::Dec | Kind::DecTf | Kind::DecPf)
    }
}

/// MN offset of the §5.3 clock synchronisation counter.
const CLOCK_COUNTER: u64 = 64;
const CAP: usize = 16;

#[derive(Default)]
struct Checker {
    /// Per lock: holders (client, mode).
    holders: HashMap<u64, Vec<(u32, LockMode)>>,
    violations: Vec<String>,
    completed: u64,
    max_acquire_ns: Nanos,
    stats: LockStats,
    /// Every acquisition: (client, lock, mode, asked at, granted at).
    log: Vec<(u32, u64, LockMode, Nanos, Nanos)>,
}

impl Checker {
    fn enter(&mut self, lock: u64, client: u32, mode: LockMode, now: Nanos) {
        let h = self.holders.entry(lock).or_default();
        let conflict = h
            .iter()
            .any(|&(_, m)| m == LockMode::Exclusive || mode == LockMode::Exclusive);
        if conflict {
            self.violations.push(format!(
                "t={now}: client {client} entered lock {lock:#x} in {mode:?} while {h:?} hold it"
            ));
        }
        h.push((client, mode));
    }

    fn exit(&mut self, lock: u64, client: u32) {
        let h = self.holders.entry(lock).or_default();
        let i = h.iter().position(|&(c, _)| c == client).expect("holder");
        h.swap_remove(i);
    }

    fn forget(&mut self, clients: &[u32]) {
        for h in self.holders.values_mut() {
            h.retain(|(c, _)| !clients.contains(c));
        }
    }
}

struct Crashed(Rc<RefCell<Vec<NodeId>>>);

impl FailureDetector for Crashed {
    fn is_failed(&self, node: NodeId) -> bool {
        self.0.borrow().contains(&node)
    }
}

fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

struct Plan {
    ops: u32,
    read_pct: u64,
    cs_ns: Nanos,
    idle_until: Nanos,
    /// Sticky first op: (lock index, exclusive, critical section) — for the crash test.
    first: Option<(usize, Nanos)>,
}

#[allow(clippy::too_many_arguments)]
async fn worker<L: RwLockClient>(
    mut lock_client: L,
    ctx: SimContext,
    id: u32,
    locks: Rc<Vec<RemoteAddr>>,
    checker: Rc<RefCell<Checker>>,
    plan: Rc<Plan>,
    seed: u64,
) {
    let mut rng = seed | 1;
    for op in 0..plan.ops {
        let r = next(&mut rng);
        let (index, cs, mode) = match (op, plan.first) {
            (0, Some((i, cs))) => (i, cs, LockMode::Exclusive),
            _ => {
                let mode = if r % 100 < plan.read_pct {
                    LockMode::Shared
                } else {
                    LockMode::Exclusive
                };
                ((r >> 8) as usize % locks.len(), plan.cs_ns, mode)
            }
        };
        let addr = locks[index];
        let t0 = ctx.now();
        let held = lock_client.acquire(addr, mode).await.expect("acquire");
        let waited = ctx.now() - t0;
        {
            let mut c = checker.borrow_mut();
            c.max_acquire_ns = c.max_acquire_ns.max(waited);
            c.log.push((id, addr.offset, mode, t0, ctx.now()));
            c.enter(addr.offset, id, mode, ctx.now());
            if std::env::var("TRACE").is_ok() {
                eprintln!("t={} enter {id} {mode:?} lock {}", ctx.now(), addr.offset);
            }
        }
        if cs > 0 {
            ctx.sleep(cs).await;
        }
        checker.borrow_mut().exit(addr.offset, id);
        lock_client.release(held).await.expect("release");
        checker.borrow_mut().completed += 1;
    }
    let stats = *lock_client.stats();
    {
        let mut c = checker.borrow_mut();
        c.stats = c.stats.merged(&stats);
    }
    lock_client.idle_until(plan.idle_until).await.expect("idle");
}

struct Setup {
    sim: Sim,
    contexts: Vec<SimContext>,
    locks: Rc<Vec<RemoteAddr>>,
}

fn setup(seed: u64, cns: u16, per_cn: u16, nlocks: usize, layout: &LockLayout) -> Setup {
    let sim = Sim::new(
        ClusterConfig::new("cx4")
            .unwrap()
            .mns(1)
            .cns(cns)
            .threads_per_cn(2)
            .mn_memory_bytes(1 << 20)
            .seed(seed),
    )
    .unwrap();
    let region = sim.region(sim.mn(0));
    let stride = layout.bytes.div_ceil(64) * 64;
    let locks: Vec<RemoteAddr> = (0..nlocks as u64)
        .map(|i| region.at(4096 + i * stride).unwrap())
        .collect();
    for l in &locks {
        sim.write_memory(sim.mn(0), l.offset, &layout.initial);
    }
    let mut contexts = Vec::new();
    for cn in 0..cns {
        for c in 0..per_cn {
            contexts.push(sim.context(sim.cn(cn), c % 2).unwrap());
        }
    }
    Setup {
        sim,
        contexts,
        locks: Rc::new(locks),
    }
}

fn layout_of(kind: Kind) -> LockLayout {
    match kind {
        Kind::Cas => dmem_locks::caslock::layout(),
        Kind::Dslr => dmem_locks::dslr::layout(),
        Kind::Shift => dmem_locks::shiftlock::layout(),
        Kind::Dec | Kind::DecTf | Kind::DecPf => dmem_locks::declock::layout::<CAP>(),
    }
}

#[allow(clippy::too_many_arguments)]
fn spawn_all(
    kind: Kind,
    s: &Setup,
    checker: &Rc<RefCell<Checker>>,
    plan: &Rc<Plan>,
    failures: Rc<dyn FailureDetector>,
    dec_config: DecLockConfig,
    plan_for: &dyn Fn(u32) -> Rc<Plan>,
) {
    let _ = plan;
    let directory = Directory::new(s.contexts.iter().map(|c| c.local_endpoint()).collect());
    let mut nodes: Vec<u16> = s
        .contexts
        .iter()
        .map(|c| c.local_endpoint().node.0)
        .collect();
    nodes.dedup();
    let cns = nodes.len();
    let policy = match kind {
        Kind::DecPf => FairnessPolicy::PhaseFair,
        _ => FairnessPolicy::TaskFair,
    };
    let mut tables: HashMap<u16, Arc<LocalLockTable>> = HashMap::new();
    let counter = s.sim.region(s.sim.mn(0)).at(CLOCK_COUNTER).unwrap();
    for (i, ctx) in s.contexts.iter().enumerate() {
        let id = i as u32;
        let seed = ctx.seed();
        let args = (
            ctx.clone(),
            id,
            Rc::clone(&s.locks),
            Rc::clone(checker),
            plan_for(id),
            seed,
        );
        match kind {
            Kind::Cas => {
                let c = CasLockClient::new(ctx.clone(), id, CasLockConfig::default(), seed);
                s.sim.spawn(
                    ctx,
                    worker(c, args.0, args.1, args.2, args.3, args.4, args.5),
                );
            }
            Kind::Dslr => {
                let c = DslrClient::new(ctx.clone(), DslrConfig::default(), seed);
                s.sim.spawn(
                    ctx,
                    worker(c, args.0, args.1, args.2, args.3, args.4, args.5),
                );
            }
            Kind::Shift => {
                let c = ShiftLockClient::new(
                    ctx.clone(),
                    id,
                    directory.clone(),
                    ShiftLockConfig::default(),
                    seed,
                )
                .unwrap();
                s.sim.spawn(
                    ctx,
                    worker(c, args.0, args.1, args.2, args.3, args.4, args.5),
                );
            }
            Kind::Dec => {
                let c = DecLockClient::<_, CAP>::new(
                    ctx.clone(),
                    id,
                    directory.clone(),
                    Rc::clone(&failures),
                    dec_config,
                    seed,
                )
                .unwrap();
                s.sim.spawn(
                    ctx,
                    worker(c, args.0, args.1, args.2, args.3, args.4, args.5),
                );
            }
            Kind::DecTf | Kind::DecPf => {
                let node = ctx.local_endpoint().node;
                let first_on_cn = !tables.contains_key(&node.0);
                let table = tables
                    .entry(node.0)
                    .or_insert_with(|| Arc::new(LocalLockTable::new(policy)));
                let mut c = DecLockClient::<_, CAP>::hierarchical(
                    ctx.clone(),
                    id,
                    directory.clone(),
                    Rc::clone(&failures),
                    dec_config,
                    seed,
                    Arc::clone(table),
                )
                .unwrap();
                s.sim.spawn(ctx, async move {
                    // §5.3: one client per CN synchronises the CN's clock first.
                    if first_on_cn {
                        c.synchronize_clock(counter, cns as u64, 1_000)
                            .await
                            .expect("clock sync");
                    } else {
                        c.wait_for_clock(1_000).await.expect("clock wait");
                    }
                    worker(c, args.0, args.1, args.2, args.3, args.4, args.5).await;
                });
            }
        }
    }
}

struct Outcome {
    violations: Vec<String>,
    completed: u64,
    max_acquire_ns: Nanos,
    stats: LockStats,
}

fn contended_run(kind: Kind, seed: u64, cns: u16, per_cn: u16, nlocks: usize, ops: u32) -> Outcome {
    let s = setup(seed, cns, per_cn, nlocks, &layout_of(kind));
    let checker = Rc::new(RefCell::new(Checker::default()));
    let end: Nanos = 400_000_000;
    let plan = Rc::new(Plan {
        ops,
        read_pct: 50,
        cs_ns: 1_500,
        idle_until: end,
        first: None,
    });
    let p = Rc::clone(&plan);
    spawn_all(
        kind,
        &s,
        &checker,
        &plan,
        Rc::new(NoFailures),
        DecLockConfig::default(),
        &move |_| Rc::clone(&p),
    );
    s.sim.run_until(end);
    let c = checker.borrow();
    Outcome {
        violations: c.violations.clone(),
        completed: c.completed,
        max_acquire_ns: c.max_acquire_ns,
        stats: c.stats,
    }
}

/// 3 CNs x 4 clients on 2 hot locks, half readers, 1.5 µs critical sections, 8 seeds per
/// lock: no instant with a writer next to any other holder; every operation completes,
/// each acquisition within 5 ms of virtual time (12 clients ahead at most).
#[test]
fn mutual_exclusion_and_liveness_under_contention_for_every_lock() {
    for kind in ALL {
        for seed in 1..=8 {
            let out = contended_run(kind, seed, 3, 4, 2, 25);
            assert!(
                out.violations.is_empty(),
                "{kind:?} seed {seed}: {:?}",
                &out.violations[..out.violations.len().min(3)]
            );
            assert_eq!(
                out.completed,
                12 * 25,
                "{kind:?} seed {seed}: not every op completed"
            );
            assert!(
                out.max_acquire_ns < 5_000_000,
                "{kind:?} seed {seed}: an acquisition took {} ns",
                out.max_acquire_ns
            );
            assert_eq!(out.stats.acquisitions, 12 * 25);
            if kind.is_declock() {
                assert_eq!(out.stats.resets, 0, "no fault, no reset");
                // ≤ 2 MN ops per acquisition by construction (FAA + entry WRITE).
                assert!(out.stats.acquire_mn_ops <= 2 * out.stats.acquisitions);
            }
        }
    }
}

/// Hierarchical DecLock (§5) under heavier contention than above: 4 CNs x 6 clients on
/// one lock, half readers, 32 seeds each for task-fair and phase-fair: mutual exclusion,
/// every operation completes, no reset, and local hand-over really happens (acquisitions
/// served without a CQL acquisition).
#[test]
fn hierarchical_declock_excludes_and_completes_under_high_contention() {
    for kind in [Kind::DecTf, Kind::DecPf] {
        for seed in 1..=32 {
            let out = contended_run(kind, seed, 4, 6, 1, 20);
            assert!(
                out.violations.is_empty(),
                "{kind:?} seed {seed}: {:?}",
                &out.violations[..out.violations.len().min(3)]
            );
            assert_eq!(out.completed, 24 * 20, "{kind:?} seed {seed}");
            assert!(
                out.max_acquire_ns < 5_000_000,
                "{kind:?} seed {seed}: {} ns",
                out.max_acquire_ns
            );
            assert_eq!(out.stats.resets, 0, "{kind:?} seed {seed}");
            assert_eq!(out.stats.retries, 0, "{kind:?} seed {seed}");
            assert!(out.stats.local_grants > 0, "{kind:?} seed {seed}");
        }
    }
}

/// Cross-CN order of a write-only run on one lock: pairs of acquisitions on different CNs
/// whose waits overlap and whose requests are more than `margin` apart, and how many of
/// them were granted in the opposite order.
fn cross_cn_inversions(c: &Checker, per_cn: u32, margin: Nanos) -> (u64, u64) {
    let (mut pairs, mut inverted) = (0, 0);
    for a in &c.log {
        for b in &c.log {
            let overlap = b.3 < a.4;
            if a.0 / per_cn != b.0 / per_cn && overlap && a.3 + margin < b.3 {
                pairs += 1;
                if b.4 < a.4 {
                    inverted += 1;
                }
            }
        }
    }
    (pairs, inverted)
}

/// DecLock-TF orders acquisitions by timestamp across CNs (§5.3): 3 CNs x 4 writers on
/// one lock with 1–4 µs critical sections. Whenever a request on one CN is more than 10 µs
/// older than a request on another CN that overlaps it, it is granted first in at least
/// 95 % of such pairs — while ownership still moves between clients of a CN without the
/// MN (local hand-over). The exceptions are the windows the paper accepts: a remote
/// waiter whose entry is not written yet when the prefetch READs the queue, and local
/// waiters of another CN that are not in the CQL queue.
#[test]
fn task_fair_orders_acquisitions_by_timestamp_across_cns() {
    let per_cn = 4u32;
    for seed in 1..=4 {
        let s = setup(seed, 3, per_cn as u16, 1, &layout_of(Kind::DecTf));
        let checker = Rc::new(RefCell::new(Checker::default()));
        let plan = Rc::new(Plan {
            ops: 40,
            read_pct: 0,
            cs_ns: 1_000 * seed,
            idle_until: 200_000_000,
            first: None,
        });
        let p = Rc::clone(&plan);
        spawn_all(
            Kind::DecTf,
            &s,
            &checker,
            &plan,
            Rc::new(NoFailures),
            DecLockConfig::default(),
            &move |_| Rc::clone(&p),
        );
        s.sim.run_until(200_000_000);
        let c = checker.borrow();
        assert!(c.violations.is_empty());
        assert_eq!(c.completed, 12 * 40);
        assert!(c.stats.local_grants > 0, "{:?}", c.stats);
        let (pairs, inverted) = cross_cn_inversions(&c, per_cn, 10_000);
        assert!(pairs > 100, "seed {seed}: only {pairs} pairs");
        assert!(
            inverted * 20 <= pairs,
            "seed {seed}: {inverted} of {pairs} cross-CN pairs out of timestamp order"
        );
        eprintln!(
            "seed {seed}: {inverted}/{pairs} cross-CN inversions, {} local grants of {} acquisitions",
            c.stats.local_grants, c.stats.acquisitions
        );
    }
}

/// Contention makes the fail-and-retry lock retry, and DecLock does not retry at all.
#[test]
fn caslock_retries_and_declock_does_not() {
    let cas = contended_run(Kind::Cas, 3, 3, 4, 1, 20);
    let dec = contended_run(Kind::Dec, 3, 3, 4, 1, 20);
    assert!(
        cas.stats.retries > cas.stats.acquisitions,
        "{:?}",
        cas.stats
    );
    assert_eq!(dec.stats.retries, 0, "{:?}", dec.stats);
    assert!(dec.stats.messages_sent > 0);
}

/// A client on CN 0 takes lock 0 exclusively and holds it for 50 ms; CN 0 crashes at
/// 1 ms. The other clients queue behind it, time out (1 ms), one resets the lock, and
/// everyone else completes every operation with mutual exclusion intact (§4.4, §6.7).
#[test]
fn declock_recovers_from_a_crashed_holder_by_reset() {
    for (kind, seed) in [Kind::Dec, Kind::DecTf, Kind::DecPf]
        .into_iter()
        .flat_map(|k| [1u64, 2, 3].map(|s| (k, s)))
    {
        let s = setup(seed, 3, 3, 2, &layout_of(kind));
        let checker = Rc::new(RefCell::new(Checker::default()));
        let failed = Rc::new(RefCell::new(Vec::new()));
        let end: Nanos = 300_000_000;
        let crash_at: Nanos = 1_000_000;
        let normal = Rc::new(Plan {
            ops: 30,
            read_pct: 30,
            cs_ns: 1_000,
            idle_until: end,
            first: None,
        });
        let doomed = Rc::new(Plan {
            ops: 30,
            read_pct: 30,
            cs_ns: 1_000,
            idle_until: end,
            first: Some((0, 50_000_000)),
        });
        let config = DecLockConfig {
            acquire_timeout_ns: 1_000_000,
            ..DecLockConfig::default()
        };
        let (n, d) = (Rc::clone(&normal), Rc::clone(&doomed));
        spawn_all(
            kind,
            &s,
            &checker,
            &normal,
            Rc::new(Crashed(Rc::clone(&failed))),
            config,
            &move |id| {
                if id == 0 {
                    Rc::clone(&d)
                } else {
                    Rc::clone(&n)
                }
            },
        );
        let cn0 = s.sim.cn(0);
        s.sim.crash_at(cn0, crash_at);
        s.sim.run_until(crash_at);
        assert!(
            checker
                .borrow()
                .holders
                .get(&s.locks[0].offset)
                .is_some_and(|h| h.contains(&(0, LockMode::Exclusive))),
            "{kind:?} seed {seed}: client 0 should hold lock 0 when its CN crashes"
        );
        // The coordinator's failure detector reports the crash; the dead clients' holds
        // are void (they touch no data any more).
        failed.borrow_mut().push(cn0);
        checker.borrow_mut().forget(&[0, 1, 2]);
        s.sim.run_until(end);
        let c = checker.borrow();
        assert!(
            c.violations.is_empty(),
            "{kind:?} seed {seed}: {:?}",
            c.violations
        );
        // 6 surviving clients x 30 ops, plus whatever CN 0's others finished before the crash.
        assert!(
            c.completed >= 6 * 30,
            "{kind:?} seed {seed}: only {} ops completed",
            c.completed
        );
        assert!(
            c.stats.resets >= 1,
            "{kind:?} seed {seed}: no reset: {:?}",
            c.stats
        );
        assert!(c.stats.timeouts >= 1);
    }
}

/// A "lock" that never waits: the checker must catch it, or the tests above prove nothing.
struct NoLock {
    stats: LockStats,
    ctx: SimContext,
}

impl RwLockClient for NoLock {
    async fn acquire(
        &mut self,
        lock: RemoteAddr,
        mode: LockMode,
    ) -> Result<dmem_locks::HeldLock, dmem_locks::LockError> {
        // Borrow a real lock's HeldLock shape through the CAS client's types.
        let mut c = CasLockClient::new(self.ctx.clone(), 0, CasLockConfig::default(), 1);
        let held = c.acquire(lock, LockMode::Shared).await?;
        let _ = mode;
        self.stats.acquisitions += 1;
        Ok(held)
    }

    async fn release(&mut self, held: dmem_locks::HeldLock) -> Result<(), dmem_locks::LockError> {
        let mut c = CasLockClient::new(self.ctx.clone(), 0, CasLockConfig::default(), 1);
        c.release(held).await
    }

    async fn idle_until(&mut self, _deadline: Nanos) -> Result<(), dmem_locks::LockError> {
        Ok(())
    }

    fn stats(&self) -> &LockStats {
        &self.stats
    }
}

#[test]
fn the_checker_catches_a_lock_that_does_not_exclude() {
    let s = setup(1, 2, 3, 1, &layout_of(Kind::Cas));
    let checker = Rc::new(RefCell::new(Checker::default()));
    let plan = Rc::new(Plan {
        ops: 10,
        read_pct: 0,
        cs_ns: 20_000,
        idle_until: 0,
        first: None,
    });
    for (i, ctx) in s.contexts.iter().enumerate() {
        let c = NoLock {
            stats: LockStats::default(),
            ctx: ctx.clone(),
        };
        s.sim.spawn(
            ctx,
            worker(
                c,
                ctx.clone(),
                i as u32,
                Rc::clone(&s.locks),
                Rc::clone(&checker),
                Rc::clone(&plan),
                ctx.seed(),
            ),
        );
    }
    s.sim.run_until_idle();
    let c = checker.borrow();
    assert_eq!(c.completed, 60);
    assert!(!c.violations.is_empty());
}

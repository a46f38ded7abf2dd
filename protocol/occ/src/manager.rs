//! The lease manager (§VII-A): adapts every coordinator's leases while transactions run.
//!
//! Each coordinator holds two leases, read-validate (`rv`) and write-wait (`ww`), and OOCC
//! stays correct as long as the largest `rv` of any coordinator is at most the smallest
//! `ww` of any (Property 2). An adjustment from `old` to `new` has two phases:
//!
//! 1. *prepare*: `rv = min(old, new) − offset`, `ww = max(old, new) + offset` on every CN,
//!    one WRITE per CN lease word; then wait `max(old, new) + offset`: one old write-wait
//!    lease, so that every writer that read the old `ww` is done waiting and no reader
//!    still trusts the old `rv` (the paper's wait), and, when the lease grows, one new
//!    write-wait lease, so that no decision with the new `rv` trusts reads from before a
//!    writer that read the old, smaller `ww` (the cross-time condition below);
//! 2. *commit*: `rv = new − offset`, `ww = new + offset` on every CN (one WRITE per CN).
//!
//! Simulation: a CN's lease word is CN-local memory, which the simulator does not expose to
//! one-sided verbs, so each WRITE goes to the coordinator's lease line on MN 0 (same cost,
//! same round trip) and the coordinator's [`Leases`] cell takes the new value when the WRITE
//! completes. Statistics: the manager READs the lease lines every period (one round trip)
//! and takes the counters from the deployment's [`Stats`] ([`run`]).
//!
//! **Across processes** ([`run_across_processes`], [`follow`]) the paper's lease word is an
//! 8-byte value in each CN's memory that the manager WRITEs with one-sided verbs (§VII-A).
//! On the tcp and shm fabrics (and this crate's rdma CNs) only MN processes expose memory
//! to one-sided verbs, so the words stay on the lease lines of MN 0, one line per
//! coordinator ([`line`](mod@line)), and each CN process (each core of one: every core has its
//! coordinators' cells) *picks its lease up*: a follower task READs the lease word of its
//! first coordinator's line every half period (the deployment chooses the period), off the
//! transaction path, sets its
//! coordinators' cells, and acknowledges by WRITing the word it applied into the `applied`
//! word of each of its coordinators' lines. In the same post list it publishes its
//! deployment's counters in its first line, which is where the manager reads them (never
//! from another process's [`Stats`]). The manager, a task of the first CN process, then
//! runs the two phases on acknowledgements rather than on WRITE completions:
//!
//! 1. WRITE the intermediate word to every coordinator's line; READ the lines until every
//!    coordinator of the plan applied it;
//! 2. wait `max(old, new) + offset`, then WRITE the new word and READ until every
//!    coordinator applied it; the next adjustment starts only after that.
//!
//! Why Property 2 still holds when the words arrive by polling. A coordinator reads `rv`
//! when it decides to skip validation (at time `d`, trusting its reads back to `d − rv`)
//! and `ww` when its commit starts (at time `c`, after its intention locks landed), so the
//! condition is not only Property 2 at each instant but also across time: *an `rv` used at
//! `d` must not exceed a `ww` read at any `c` in `(d − rv, d)`*. A reader that read a record
//! before a writer's intention lock and a second one after that writer's commit WRITE has
//! run for more than the writer's `ww`, so it skips validation only if `rv ≤ ww`.
//!
//! * A follower never skips a state: the manager writes the next word only once every
//!   coordinator acknowledged the current one, so every coordinator steps `old →
//!   intermediate → new` and, at each instant, holds one of two neighbouring states;
//!   Tables II and III give Property 2 for each pair.
//! * A coordinator that has not picked up the intermediate word holds `old` (a CN process
//!   starts with the protocol's initial lease, the manager's `old` of its first adjustment),
//!   and the commit word is not written before it does.
//! * Growing (`new > old`): a coordinator uses `rv = new − offset` only after the new word
//!   was written, at least `new + offset` after the last acknowledgement of the
//!   intermediate word, and since that acknowledgement no coordinator reads a `ww` below
//!   `new + offset`. So no `ww = old + offset` read lies within `rv` before a decision with
//!   the new `rv` (the paper waits one *old* lease, which covers the records' leases but not
//!   a decision that reads the larger `rv` after a writer read the smaller `ww`; the
//!   simulator's [`run`] waits `max(old, new) + offset` too).
//! * Shrinking (`new < old`): a coordinator reads `ww = new + offset` only after every
//!   coordinator acknowledged `rv = new − offset`, so every decision after that read uses
//!   at most `new − offset`; the wait of `old + offset` is the paper's.
//!
//! An acknowledgement is only written after the cells changed, and the manager's READ that
//! sees it completes after it landed, so "acknowledged" means "applied". The manager's
//! waits run on its own clock; the offset covers two clocks' rates over one lease
//! (§VII-B). Each word is one aligned 8-byte value, written and read whole on tcp (one MN
//! thread applies a post) and shm (8-byte atomics). A coordinator that never acknowledges
//! (its CN process died) stops the manager between two states, where Property 2 holds:
//! the lease stops adapting, transactions stay safe.
//!
//! Policy: at least 80 % of read-only transactions should skip validation. When more than
//! 20 % of those in a period ran out of their lease, the lease doubles (up to 1.6 ms); when
//! every one of them finished in under a quarter of the lease, it shrinks to twice the
//! longest one seen (not below 10 µs).

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use dmem_verbs::{Clock, Nanos, NodeId, PostList, RemoteAddr, Verbs};

use crate::drift::DriftingCtx;
use crate::oocc::{Leases, Stats};
use crate::store::{Directory, LEASE_LINE};

/// Every coordinator's leases, with its id and CN (shared by the deployment and the
/// manager).
pub type LeaseTable = Rc<RefCell<Vec<(u16, NodeId, Rc<Leases>)>>>;

/// Bounds and period of the adaptive policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Statistics period, ns.
    pub period_ns: Nanos,
    /// Smallest lease, ns.
    pub min_lease_ns: Nanos,
    /// Largest lease, ns.
    pub max_lease_ns: Nanos,
    /// Drift offset, ns.
    pub offset_ns: Nanos,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            period_ns: 200_000,
            min_lease_ns: 10_000,
            max_lease_ns: 1_600_000,
            offset_ns: 1_000,
        }
    }
}

/// What the manager did (true time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Adjustment {
    /// When the prepare phase started.
    pub started: Nanos,
    /// When the commit phase's WRITEs completed.
    pub finished: Nanos,
    /// Old lease, ns.
    pub from: Nanos,
    /// New lease, ns.
    pub to: Nanos,
}

/// The manager's state, shared with the deployment.
#[derive(Debug, Default)]
pub struct ManagerLog {
    /// Every adjustment made.
    pub adjustments: RefCell<Vec<Adjustment>>,
    /// The current lease, ns.
    pub lease: Cell<Nanos>,
}

/// The next lease for a period's counters (`None`: keep it).
#[must_use]
pub fn decide(lease: Nanos, ro: u64, expired: u64, longest: Nanos, p: &Policy) -> Option<Nanos> {
    if ro == 0 {
        return None;
    }
    if expired * 5 > ro {
        let new = (lease * 2).min(p.max_lease_ns);
        return (new != lease).then_some(new);
    }
    if expired == 0 && longest > 0 && longest * 4 < lease {
        let new = (longest * 2).max(p.min_lease_ns);
        return (new < lease).then_some(new);
    }
    None
}

/// Sets every coordinator's leases through one WRITE per CN; resolves when all landed.
async fn set_all<C: Verbs + Clock>(
    ctx: &DriftingCtx<C>,
    dir: &Directory,
    coordinators: &[(u16, NodeId, Rc<Leases>)],
    rv: Nanos,
    ww: Nanos,
) {
    let mut list = PostList::new();
    let mut cns: Vec<NodeId> = Vec::new();
    for (id, node, _) in coordinators {
        if !cns.contains(node) {
            cns.push(*node);
            let word = (rv << 32) | (ww & 0xFFFF_FFFF);
            list.write(
                dir.addr(0, dir.layout().lease_offset(*id)),
                &word.to_le_bytes(),
            );
        }
    }
    if !list.is_empty() {
        let _ = ctx.post(list).await;
    }
    for (_, _, l) in coordinators {
        l.rv.set(rv);
        l.ww.set(ww);
    }
}

/// Runs the manager until transactions stop for a whole period.
pub async fn run<C: Verbs + Clock>(
    ctx: DriftingCtx<C>,
    dir: Rc<Directory>,
    stats: Rc<Stats>,
    coordinators: LeaseTable,
    policy: Policy,
    log: Rc<ManagerLog>,
) {
    let (mut last_ro, mut last_expired, mut last_all) = (0, 0, 0);
    loop {
        ctx.sleep(policy.period_ns).await;
        // Read the statistics (one round trip over the lease lines).
        let mut list = PostList::new();
        list.read(dir.addr(0, 0), 64);
        let _ = ctx.post(list).await;
        let ro = stats.ro_committed.get();
        let expired = stats.ro_lease_expired.get();
        let all = ro + stats.rw_committed.get() + stats.aborts.get();
        if all == last_all && all > 0 {
            return;
        }
        let longest = stats.ro_longest_ns.replace(0);
        let lease = log.lease.get();
        let next = decide(
            lease,
            ro - last_ro,
            expired - last_expired,
            longest,
            &policy,
        );
        (last_ro, last_expired, last_all) = (ro, expired, all);
        let Some(new) = next else { continue };
        let started = ctx.true_now();
        let cos = coordinators.borrow().clone();
        let off = policy.offset_ns;
        set_all(
            &ctx,
            &dir,
            &cos,
            lease.min(new).saturating_sub(off),
            lease.max(new) + off,
        )
        .await;
        ctx.sleep(lease.max(new) + off).await;
        let cos = coordinators.borrow().clone();
        set_all(&ctx, &dir, &cos, new.saturating_sub(off), new + off).await;
        log.lease.set(new);
        log.adjustments.borrow_mut().push(Adjustment {
            started,
            finished: ctx.true_now(),
            from: lease,
            to: new,
        });
    }
}

/// The words of a coordinator's lease line on MN 0 across processes (byte offsets in the
/// line, little endian; the simulator uses only [`LEASE`](line::LEASE)).
pub mod line {
    /// The lease word the manager wrote ([`encode`](super::encode); 0: none yet, the
    /// protocol's initial lease holds).
    pub const LEASE: u64 = 0;
    /// The lease word the coordinator's CN applied last (its acknowledgement).
    pub const APPLIED: u64 = 8;
    /// Counters of the CN's deployment (in its first coordinator's line only; 0 in the
    /// others): committed read-only transactions,
    pub const RO: u64 = 16;
    /// of those the ones whose lease ran out,
    pub const EXPIRED: u64 = 24;
    /// and the longest read-only execution of its last two half periods, ns.
    pub const LONGEST: u64 = 32;
    /// Bytes of the counters.
    pub const COUNTERS: usize = 24;
}

/// One lease word: `rv` in the high 32 bits, `ww` in the low 32 (ns; the largest lease is
/// 1.6 ms).
#[must_use]
pub fn encode(rv: Nanos, ww: Nanos) -> u64 {
    (rv << 32) | (ww & 0xFFFF_FFFF)
}

/// `(rv, ww)` of a lease word.
#[must_use]
pub fn decode(word: u64) -> (Nanos, Nanos) {
    (word >> 32, word & 0xFFFF_FFFF)
}

/// What a CN's follower has applied so far.
#[derive(Debug, Default)]
pub struct FollowerLog {
    /// The lease word its coordinators hold (0: the initial lease, nothing applied).
    pub applied: Cell<u64>,
    /// How many lease words it applied.
    pub updates: Cell<u64>,
}

/// Coordinator `id`'s lease line, word `at`.
fn line_addr(dir: &Directory, id: u16, at: u64) -> RemoteAddr {
    dir.addr(0, dir.layout().lease_offset(id) + at)
}

/// The little-endian word at `at` of `bytes`.
fn word(bytes: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(w)
}

/// A CN process's (or one core's) side of the manager across processes: every `poll_ns`,
/// publishes `stats` in its first coordinator's lease line and READs the lease word there;
/// a new word goes into every coordinator cell of `coordinators` and is acknowledged on
/// each of their lines (module docs). Never returns (it stops with the process).
pub async fn follow<C: Verbs + Clock>(
    ctx: C,
    dir: Rc<Directory>,
    stats: Rc<Stats>,
    coordinators: LeaseTable,
    poll_ns: Nanos,
    log: Rc<FollowerLog>,
) {
    let mut previous_longest = 0;
    loop {
        ctx.sleep(poll_ns).await;
        let ids: Vec<u16> = coordinators.borrow().iter().map(|(id, _, _)| *id).collect();
        let Some(&first) = ids.first() else { continue };
        let window = stats.ro_longest_ns.replace(0);
        let longest = window.max(previous_longest);
        previous_longest = window;
        let mut counters = Vec::with_capacity(line::COUNTERS);
        for w in [
            stats.ro_committed.get(),
            stats.ro_lease_expired.get(),
            longest,
        ] {
            counters.extend_from_slice(&w.to_le_bytes());
        }
        let mut list = PostList::new();
        list.write(line_addr(&dir, first, line::RO), &counters);
        // Acknowledged again every time: a coordinator made since is acknowledged too.
        push_acks(&mut list, &dir, &ids, log.applied.get());
        let lease = list.read(line_addr(&dir, first, line::LEASE), 8);
        let Ok(res) = ctx.post(list).await else {
            continue;
        };
        let now = word(res.bytes(lease), 0);
        if now == 0 || now == log.applied.get() {
            continue;
        }
        let (rv, ww) = decode(now);
        for (_, _, l) in coordinators.borrow().iter() {
            l.rv.set(rv);
            l.ww.set(ww);
        }
        log.applied.set(now);
        log.updates.set(log.updates.get() + 1);
        // Acknowledge at once (applied before this WRITE is posted).
        let mut acks = PostList::new();
        push_acks(&mut acks, &dir, &ids, now);
        let _ = ctx.post(acks).await;
    }
}

/// WRITEs of `applied` into the `applied` word of each of `ids`' lines (none for 0).
fn push_acks(list: &mut PostList, dir: &Directory, ids: &[u16], applied: u64) {
    if applied != 0 {
        for &id in ids {
            list.write(line_addr(dir, id, line::APPLIED), &applied.to_le_bytes());
        }
    }
}

/// The lease lines of coordinators `ids` on MN 0, READ in one round trip (`None` if the
/// READ failed): per id its line's bytes.
async fn read_lines<C: Verbs>(ctx: &C, dir: &Directory, ids: &[u16]) -> Option<Vec<Vec<u8>>> {
    let (lo, hi) = (*ids.iter().min()?, *ids.iter().max()?);
    let span = u64::from(hi - lo + 1) * LEASE_LINE;
    let mut list = PostList::new();
    let read = list.read(line_addr(dir, lo, 0), u32::try_from(span).ok()?);
    let res = ctx.post(list).await.ok()?;
    let bytes = res.bytes(read);
    Some(
        ids.iter()
            .map(|&id| {
                let at = usize::try_from(u64::from(id - lo) * LEASE_LINE).unwrap_or(0);
                bytes[at..at + LEASE_LINE as usize].to_vec()
            })
            .collect(),
    )
}

/// WRITEs `word` to the lease word of every line of `ids`, then READs the lines every
/// `poll_ns` until each one's `applied` word is `word`.
async fn set_and_await<C: Verbs + Clock>(
    ctx: &C,
    dir: &Directory,
    ids: &[u16],
    word_: u64,
    poll_ns: Nanos,
) {
    loop {
        let mut list = PostList::new();
        for &id in ids {
            list.write(line_addr(dir, id, line::LEASE), &word_.to_le_bytes());
        }
        if ctx.post(list).await.is_ok() {
            break;
        }
        ctx.sleep(poll_ns).await;
    }
    loop {
        if let Some(lines) = read_lines(ctx, dir, ids).await
            && lines
                .iter()
                .all(|l| word(l, line::APPLIED as usize) == word_)
        {
            return;
        }
        ctx.sleep(poll_ns).await;
    }
}

/// The manager across processes (module docs): every period, READs the lease lines of
/// coordinators `ids` (every coordinator of the cluster) for the counters the CNs published,
/// decides, and adjusts in two acknowledged phases. Never returns (it stops with the
/// process).
pub async fn run_across_processes<C: Verbs + Clock>(
    ctx: C,
    dir: Rc<Directory>,
    ids: Vec<u16>,
    policy: Policy,
    log: Rc<ManagerLog>,
) {
    let poll = (policy.period_ns / 2).max(1);
    let (mut last_ro, mut last_expired) = (0, 0);
    loop {
        ctx.sleep(policy.period_ns).await;
        let Some(lines) = read_lines(&ctx, &dir, &ids).await else {
            continue;
        };
        let (mut ro, mut expired, mut longest) = (0, 0, 0);
        for l in &lines {
            ro += word(l, line::RO as usize);
            expired += word(l, line::EXPIRED as usize);
            longest = longest.max(word(l, line::LONGEST as usize));
        }
        let lease = log.lease.get();
        let next = decide(
            lease,
            ro.saturating_sub(last_ro),
            expired.saturating_sub(last_expired),
            longest,
            &policy,
        );
        (last_ro, last_expired) = (ro, expired);
        let Some(new) = next else { continue };
        let started = ctx.now();
        let off = policy.offset_ns;
        let intermediate = encode(lease.min(new).saturating_sub(off), lease.max(new) + off);
        set_and_await(&ctx, &dir, &ids, intermediate, poll).await;
        ctx.sleep(lease.max(new) + off).await;
        set_and_await(
            &ctx,
            &dir,
            &ids,
            encode(new.saturating_sub(off), new + off),
            poll,
        )
        .await;
        log.lease.set(new);
        log.adjustments.borrow_mut().push(Adjustment {
            started,
            finished: ctx.now(),
            from: lease,
            to: new,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_raises_a_too_small_lease_and_shrinks_a_far_too_large_one() {
        let p = Policy::default();
        assert_eq!(decide(5_000, 100, 50, 9_000, &p), Some(10_000));
        assert_eq!(decide(100_000, 100, 10, 9_000, &p), None);
        assert_eq!(decide(100_000, 100, 0, 9_000, &p), Some(18_000));
        assert_eq!(decide(100_000, 100, 0, 40_000, &p), None);
        assert_eq!(decide(1_600_000, 100, 90, 0, &p), None);
        assert_eq!(decide(100_000, 0, 0, 0, &p), None);
    }

    #[test]
    fn a_lease_word_carries_both_leases() {
        assert_eq!(decode(encode(99_000, 201_000)), (99_000, 201_000));
        assert_eq!(encode(0, 0), 0);
    }
}

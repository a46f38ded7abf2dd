//! The lease manager (§VII-A): adapts every coordinator's leases while transactions run.
//!
//! Each coordinator holds two leases, read-validate (`rv`) and write-wait (`ww`), and OOCC
//! stays correct as long as the largest `rv` of any coordinator is at most the smallest
//! `ww` of any (Property 2). An adjustment from `old` to `new` has two phases:
//!
//! 1. *prepare*: `rv = min(old, new) − offset`, `ww = max(old, new) + offset` on every CN,
//!    one WRITE per CN lease word; then wait one old write-wait lease, so that every
//!    writer that read the old `ww` is done waiting and no reader still trusts the old `rv`;
//! 2. *commit*: `rv = new − offset`, `ww = new + offset` on every CN (one WRITE per CN).
//!
//! Simulation: a CN's lease word is CN-local memory, which the simulator does not expose to
//! one-sided verbs, so each WRITE goes to the coordinator's lease line on MN 0 (same cost,
//! same round trip) and the coordinator's [`Leases`] cell takes the new value when the WRITE
//! completes. Statistics: the manager READs the lease lines every period (one round trip)
//! and takes the counters from the deployment's [`Stats`].
//!
//! Policy: at least 80 % of read-only transactions should skip validation. When more than
//! 20 % of those in a period ran out of their lease, the lease doubles (up to 1.6 ms); when
//! every one of them finished in under a quarter of the lease, it shrinks to twice the
//! longest one seen (not below 10 µs).

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use dmem_verbs::{Clock, Nanos, NodeId, PostList, Verbs};

use crate::drift::DriftingCtx;
use crate::oocc::{Leases, Stats};
use crate::store::Directory;

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
        ctx.sleep(lease + off).await;
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
}

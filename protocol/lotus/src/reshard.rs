//! Pass-by-range resharding (LOTUS §4.3): the second level of load balancing.
//!
//! Every CN measures the mean latency of the transactions its coordinators finish and
//! writes it, every [`ReshardConfig::interval`] (100 ms in the paper), to its record in a
//! metrics region in MN memory ([`CnMetric`], on MN 0), then reads every CN's record. A CN
//! whose latency stays more than 50 % above the cluster's average for three intervals in a
//! row ([`LoadMonitor`]) hands its hottest shard (most lock requests since the last
//! interval, [`hottest_shard`]) to the CN with the lowest latency ([`Handover`]):
//!
//! 1. it stops serving the shard ([`ShardMap::begin_move`]; requests get `NotOwner` and
//!    their senders retry with the map they read afresh);
//! 2. it waits for the shard's locks to be released; after [`ReshardConfig::drain_timeout`]
//!    (10 ms) it aborts their holders: the shard's generation is bumped
//!    ([`ShardMap::abort_holders`], a holder checks it when it reaches commit and aborts)
//!    and their lock-state entries are released — except those of transactions already
//!    committing, which cannot abort any more and are waited for;
//! 3. it clears the shard's entries of its version-table cache;
//! 4. it sends the receiver a hand-over message; the receiver clears its own cache entries
//!    of the shard, takes the shard ([`ShardMap::finish_move`], which is also the routing
//!    layer's map: the router reads the same `ShardMap`) and replies.
//!
//! The shard is served by nobody from step 1 to step 4: that is the service interruption
//! the paper reports (0.19 ms TATP, 0.86 ms TPC-C, 4.67 ms SmallBank), recorded here per
//! hand-over ([`HandoverEvent`]).
//!
//! Choices where the paper is silent: the metric is the mean latency (first begin to
//! commit or abort of one attempt) of the transactions *run* on the CN; CNs whose record is
//! older than the previous interval, or that failed, are left out of the average and cannot
//! receive; a CN that finished no transaction counts as latency 0 (it has capacity to
//! spare); a CN hands over at most one shard per interval, and its streak restarts after a
//! hand-over; the monitor stops once an interval passes in which no CN finished a
//! transaction (the run is over: a simulation must become idle).
//!
//! [`LoadMonitor`] and [`Handover`] are plain state machines (a test drives them step by
//! step); [`monitor`] is the thin async shell one task per CN runs.

use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use dmem_layout::bytes::{ByteReader, ByteSink, SliceWriter};
use dmem_locks::LockMode;
use dmem_verbs::{Clock, Nanos, RemoteAddr, Verbs, VerbsExt};

use crate::locking::{CnLocks, LockCluster};
use crate::shard::ShardMap;
use crate::wire::{LockEntry, Reply, Request, RequestKind, Status, WireError};

/// Resharding's knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReshardConfig {
    /// Whether the load monitor runs at all. Off by default in the simulator: its periodic
    /// task keeps a simulation from going idle until an interval passes without
    /// transactions, which moves the end of short runs (the litmus suite's crash points
    /// are drawn over a run's length); runs that measure resharding turn it on.
    pub enabled: bool,
    /// How often each CN writes and compares its metric (§4.3: 100 ms), virtual ns.
    pub interval: Nanos,
    /// A CN is overloaded above this percentage of the cluster's mean latency (150).
    pub overload_pct: u64,
    /// Consecutive overloaded intervals before a hand-over (3).
    pub intervals: u32,
    /// How long the sender waits for the shard's holders before aborting them (10 ms).
    pub drain_timeout: Nanos,
    /// How often the sender looks at the shard's holders while draining.
    pub poll: Nanos,
    /// How long the sender waits for the receiver's reply before asking again.
    pub ack_timeout: Nanos,
    /// `false` is a planted bug: hand the shard over at once, its holders keeping their
    /// locks (no drain, no abort).
    pub drain: bool,
}

impl Default for ReshardConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            interval: 100_000_000,
            overload_pct: 150,
            intervals: 3,
            drain_timeout: 10_000_000,
            poll: 2_000,
            ack_timeout: 1_000_000,
            drain: true,
        }
    }
}

/// One CN's record in the metrics region: little-endian `interval u64 | mean latency ns
/// u64 | transactions u64`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CnMetric {
    /// The monitor interval it was written in (0: never written).
    pub interval: u64,
    /// Mean latency of the transactions finished in that interval, ns.
    pub latency_ns: u64,
    /// Transactions finished in that interval.
    pub txns: u64,
}

impl CnMetric {
    /// Bytes of one record.
    pub const BYTES: usize = 24;

    /// The encoding.
    #[must_use]
    pub fn emit(&self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        let mut w = SliceWriter::new(&mut b);
        w.put_u64(self.interval);
        w.put_u64(self.latency_ns);
        w.put_u64(self.txns);
        debug_assert_eq!(w.finish(), Ok(Self::BYTES));
        b
    }

    /// Parses one record.
    ///
    /// # Errors
    /// [`WireError::Truncated`] unless `b` is exactly [`CnMetric::BYTES`] long.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        let mut r = ByteReader::new(b);
        let m = Self {
            interval: r.u64()?,
            latency_ns: r.u64()?,
            txns: r.u64()?,
        };
        r.finish()?;
        Ok(m)
    }
}

/// Bytes of the metrics region for `cns` CNs.
#[must_use]
pub fn region_bytes(cns: u16) -> u64 {
    u64::from(cns) * CnMetric::BYTES as u64
}

/// One CN's overload detector (§4.3): fed every CN's metrics once per interval, it says
/// when this CN should hand a shard over, and to whom.
#[derive(Debug, Clone)]
pub struct LoadMonitor {
    me: u16,
    overload_pct: u64,
    needed: u32,
    streak: u32,
}

impl LoadMonitor {
    /// The detector of CN `me`.
    #[must_use]
    pub fn new(me: u16, cfg: &ReshardConfig) -> Self {
        Self {
            me,
            overload_pct: cfg.overload_pct,
            needed: cfg.intervals.max(1),
            streak: 0,
        }
    }

    /// Consecutive overloaded intervals so far.
    #[must_use]
    pub fn streak(&self) -> u32 {
        self.streak
    }

    /// Looks at `metrics` (indexed by CN) in interval `interval`; `failed` CNs are left
    /// out. Returns the receiver when this CN was overloaded for the configured number of
    /// intervals in a row (and restarts its count).
    pub fn observe(&mut self, interval: u64, metrics: &[CnMetric], failed: &[u16]) -> Option<u16> {
        let fresh = |(c, m): &(usize, &CnMetric)| {
            m.interval > 0
                && m.interval + 1 >= interval
                && !failed.contains(&u16::try_from(*c).unwrap_or(u16::MAX))
        };
        let live: Vec<(usize, &CnMetric)> = metrics.iter().enumerate().filter(fresh).collect();
        let latency = |m: &CnMetric| if m.txns == 0 { 0 } else { m.latency_ns };
        let Some(mine) = metrics
            .get(usize::from(self.me))
            .filter(|m| m.txns > 0 && live.len() > 1)
        else {
            self.streak = 0;
            return None;
        };
        let mean = live
            .iter()
            .map(|(_, m)| u128::from(latency(m)))
            .sum::<u128>()
            / live.len() as u128;
        if u128::from(mine.latency_ns) * 100 > mean * u128::from(self.overload_pct) {
            self.streak += 1;
        } else {
            self.streak = 0;
        }
        if self.streak < self.needed {
            return None;
        }
        // The least-loaded other CN: lowest latency (an idle CN counts as 0).
        let to = live
            .iter()
            .filter(|(c, _)| *c != usize::from(self.me))
            .min_by_key(|(c, m)| (latency(m), *c))
            .and_then(|(c, _)| u16::try_from(*c).ok())?;
        self.streak = 0;
        Some(to)
    }
}

/// The shard `locks`'s CN serves that received the most lock requests since the counts
/// were last cleared (ties: the lowest shard number).
#[must_use]
pub fn hottest_shard(locks: &CnLocks, map: &ShardMap) -> Option<u16> {
    locks
        .shard_hits
        .iter()
        .enumerate()
        .filter_map(|(s, n)| Some((u16::try_from(s).ok()?, n.load(Ordering::Relaxed))))
        .filter(|&(s, n)| n > 0 && map.serves(locks.cn, s))
        .max_by_key(|&(s, n)| (n, std::cmp::Reverse(s)))
        .map(|(s, _)| s)
}

pub use crate::locking::HandoverEvent;

/// What the sender's shell does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandoverStep {
    /// Look again after this many ns (holders still draining).
    Wait(Nanos),
    /// Send this message to the receiver's lock server and wait for its reply.
    Send(Request),
    /// Finished.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Draining,
    Aborting,
    Sending,
    Done,
}

/// The sender's side of one hand-over (§4.3), a state machine over the cluster's shared
/// lock state: [`Handover::start`], then [`Handover::step`] until it asks to send, then
/// [`Handover::acked`] when the receiver replied.
#[derive(Debug, Clone)]
pub struct Handover {
    /// The shard.
    pub shard: u16,
    /// The sender.
    pub from: u16,
    /// The receiver.
    pub to: u16,
    /// When the sender stopped serving the shard.
    pub stopped_at: Nanos,
    deadline: Nanos,
    drain: bool,
    poll: Nanos,
    phase: Phase,
    /// Lock-state entries taken from their holders.
    pub aborted_holders: u64,
}

impl Handover {
    /// Step 1: CN `from` stops serving `shard`, to be handed to `to`.
    #[must_use]
    pub fn start(
        cluster: &LockCluster,
        from: u16,
        shard: u16,
        to: u16,
        now: Nanos,
        cfg: &ReshardConfig,
    ) -> Self {
        cluster.map.borrow_mut().begin_move(shard);
        Self {
            shard,
            from,
            to,
            stopped_at: now,
            deadline: now.saturating_add(cfg.drain_timeout),
            drain: cfg.drain,
            poll: cfg.poll.max(1),
            phase: Phase::Draining,
            aborted_holders: 0,
        }
    }

    /// Steps 2–4 as far as they go at `now`.
    pub fn step(&mut self, cluster: &LockCluster, now: Nanos) -> HandoverStep {
        let locks = &cluster.cns[usize::from(self.from)];
        loop {
            match self.phase {
                Phase::Draining => {
                    if !self.drain || locks.holders_in(self.shard).is_empty() {
                        self.phase = Phase::Sending;
                    } else if now >= self.deadline {
                        cluster.map.borrow_mut().abort_holders(self.shard);
                        self.phase = Phase::Aborting;
                    } else {
                        return HandoverStep::Wait(self.poll);
                    }
                }
                Phase::Aborting => {
                    let committing = cluster.committing_txns.borrow();
                    let mut waiting = false;
                    for (key, holder) in locks.holders_in(self.shard) {
                        if committing.contains(&holder.txn) {
                            waiting = true;
                        } else if locks.table.release(key, holder) {
                            self.aborted_holders += 1;
                        }
                    }
                    if waiting {
                        return HandoverStep::Wait(self.poll);
                    }
                    self.phase = Phase::Sending;
                }
                Phase::Sending => {
                    // Step 3: this CN will not see the shard's writes any more.
                    locks.vt.clear_shard(self.shard);
                    return HandoverStep::Send(self.message());
                }
                Phase::Done => return HandoverStep::Done,
            }
        }
    }

    /// The hand-over message (step 4): one entry naming the shard; `txn` carries the time
    /// the sender stopped serving it (for the interruption's measurement).
    #[must_use]
    pub fn message(&self) -> Request {
        Request {
            kind: RequestKind::Handover,
            cn: self.from,
            req: u64::from(self.shard),
            txn: self.stopped_at,
            entries: vec![LockEntry {
                key: 0,
                shard: self.shard,
                mode: LockMode::Exclusive,
            }],
        }
    }

    /// The receiver replied: the hand-over is complete.
    pub fn acked(&mut self, cluster: &LockCluster) {
        self.phase = Phase::Done;
        if let Some(e) = cluster
            .handovers
            .borrow_mut()
            .iter_mut()
            .rev()
            .find(|e| e.shard == self.shard && e.stopped_at == self.stopped_at)
        {
            e.aborted_holders = self.aborted_holders;
        }
    }

    /// Whether it finished.
    #[must_use]
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }
}

/// The load monitor of CN `cn` (§4.3), run as one task on a context of that CN: every
/// interval it writes its metric to `region` (the metrics region's base: CN `c`'s record
/// at `c × 24`), reads every CN's, and hands a shard over when [`LoadMonitor`] says so.
/// Returns when the CN fails or an interval passes without any transaction finishing.
pub async fn monitor<V: Verbs + Clock>(
    ctx: V,
    cluster: Rc<LockCluster>,
    cn: u16,
    thread: u16,
    region: RemoteAddr,
    cfg: ReshardConfig,
) {
    let cns = u16::try_from(cluster.cns.len()).unwrap_or(u16::MAX);
    let mut detector = LoadMonitor::new(cn, &cfg);
    let Some(locks) = cluster.cns.get(usize::from(cn)).map(Arc::clone) else {
        return;
    };
    let period = cfg.interval.max(1);
    loop {
        // A fixed schedule (interval k ends at k × period), so that CNs stay in step.
        ctx.sleep_until((ctx.now() / period + 1) * period).await;
        if cluster.is_failed(cn) {
            return;
        }
        let interval = ctx.now() / period;
        let (sum, n) = locks.take_latency();
        let mine = CnMetric {
            interval,
            latency_ns: sum.checked_div(n).unwrap_or(0),
            txns: n,
        };
        let mut at = region;
        at.offset += u64::from(cn) * CnMetric::BYTES as u64;
        if ctx.write(at, &mine.emit()).await.is_err() {
            return;
        }
        let Ok(bytes) = ctx
            .read(region, u32::try_from(region_bytes(cns)).unwrap_or(u32::MAX))
            .await
        else {
            return;
        };
        let metrics: Vec<CnMetric> = bytes
            .chunks_exact(CnMetric::BYTES)
            .map(|b| CnMetric::parse(b).unwrap_or_default())
            .collect();
        let quiet = metrics
            .iter()
            .all(|m| m.txns == 0 || m.interval + 1 < interval);
        if quiet {
            return;
        }
        let failed = cluster.failed.borrow().clone();
        let decision = detector.observe(interval, &metrics, &failed);
        let shard = hottest_shard(&locks, &cluster.map.borrow());
        locks.clear_shard_hits();
        if let (Some(to), Some(shard)) = (decision, shard) {
            hand_over(&ctx, &cluster, cn, thread, shard, to, &cfg).await;
        }
    }
}

/// Runs one [`Handover`] to completion (the shell of the state machine).
async fn hand_over<V: Verbs + Clock>(
    ctx: &V,
    cluster: &LockCluster,
    from: u16,
    thread: u16,
    shard: u16,
    to: u16,
    cfg: &ReshardConfig,
) {
    let mut h = Handover::start(cluster, from, shard, to, ctx.now(), cfg);
    loop {
        match h.step(cluster, ctx.now()) {
            HandoverStep::Done => return,
            HandoverStep::Wait(ns) => ctx.sleep(ns).await,
            HandoverStep::Send(msg) => {
                if cluster.is_failed(to) {
                    // The receiver failed meanwhile: keep the shard.
                    cluster.map.borrow_mut().finish_move(shard, from);
                    h.acked(cluster);
                    return;
                }
                let Some(server) = cluster.server(to, thread) else {
                    cluster.map.borrow_mut().finish_move(shard, from);
                    return;
                };
                if ctx.send(server, &msg.emit()).await.is_err() {
                    return;
                }
                let deadline = ctx.now() + cfg.ack_timeout;
                // A receive error ends the wait like the deadline.
                while let Some(m) = dmem_verbs::recv_until(ctx, deadline).await.ok().flatten() {
                    if Reply::parse(&m.payload)
                        .is_ok_and(|r| r.req == u64::from(shard) && r.status == Status::Granted)
                    {
                        h.acked(cluster);
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmem_locks::lotus::{Acquired, Holder};

    fn metric(interval: u64, latency_ns: u64, txns: u64) -> CnMetric {
        CnMetric {
            interval,
            latency_ns,
            txns,
        }
    }

    fn cluster(cns: u16) -> LockCluster {
        LockCluster::new(
            (0..cns).map(|c| Arc::new(CnLocks::new(c, 4096))).collect(),
            Vec::new(),
            Rc::new(std::cell::RefCell::new(ShardMap::new(cns))),
            crate::shard::Sharding::default(),
            60,
        )
    }

    #[test]
    fn metric_round_trip_and_bad_length() {
        let m = metric(7, 12_345, 99);
        assert_eq!(CnMetric::parse(&m.emit()), Ok(m));
        assert_eq!(CnMetric::parse(&[0; 23]), Err(WireError::Truncated(23)));
    }

    #[test]
    fn overloaded_for_three_intervals_hands_to_the_least_loaded() {
        let cfg = ReshardConfig::default();
        let mut m = LoadMonitor::new(0, &cfg);
        // Mean of (30, 10, 5, 5) = 12.5: CN 0 is 2.4× above; CN 2 and 3 tie, 2 wins.
        let hot = |i| {
            vec![
                metric(i, 30, 9),
                metric(i, 10, 9),
                metric(i, 5, 9),
                metric(i, 5, 9),
            ]
        };
        assert_eq!(m.observe(1, &hot(1), &[]), None);
        assert_eq!(m.observe(2, &hot(2), &[]), None);
        assert_eq!(m.streak(), 2);
        assert_eq!(m.observe(3, &hot(3), &[]), Some(2));
        assert_eq!(m.streak(), 0, "the count restarts after a hand-over");
        // A failed CN never receives; a stale record is left out.
        for i in 4..6 {
            assert_eq!(m.observe(i, &hot(i), &[2]), None);
        }
        assert_eq!(m.observe(6, &hot(6), &[2]), Some(3));
        let mut stale = hot(9);
        stale[1].interval = 3;
        let mut n = LoadMonitor::new(0, &cfg);
        for i in 9..12 {
            let mut s = stale.clone();
            s.iter_mut().skip(2).for_each(|x| x.interval = i);
            s[0].interval = i;
            let got = n.observe(i, &s, &[]);
            assert_ne!(got, Some(1), "CN 1's record is stale");
        }
    }

    #[test]
    fn a_normal_interval_resets_the_streak_and_idle_cns_count_as_zero() {
        let cfg = ReshardConfig::default();
        let mut m = LoadMonitor::new(1, &cfg);
        let even = |i| vec![metric(i, 10, 5), metric(i, 12, 5), metric(i, 10, 5)];
        let hot = |i| vec![metric(i, 10, 5), metric(i, 40, 5), metric(i, 10, 5)];
        assert_eq!(m.observe(1, &hot(1), &[]), None);
        assert_eq!(m.observe(2, &hot(2), &[]), None);
        assert_eq!(m.observe(3, &even(3), &[]), None);
        assert_eq!(m.streak(), 0);
        // Two CNs busy at equal latency and one idle: 10 > 1.5 × 20/3.
        let skew = |i| vec![metric(i, 0, 0), metric(i, 10, 5), metric(i, 10, 5)];
        for i in 4..6 {
            assert_eq!(m.observe(i, &skew(i), &[]), None);
        }
        assert_eq!(m.observe(6, &skew(6), &[]), Some(0));
    }

    #[test]
    fn hottest_shard_is_the_most_requested_served_one() {
        let c = cluster(3);
        let locks = &c.cns[1];
        let h = Holder { txn: 1, cn: 0 };
        for (key, shard) in [(1, 4), (2, 4), (3, 7), (4, 5)] {
            assert!(locks.acquire(key, shard, LockMode::Shared, h).is_held());
        }
        // Shard 5 belongs to CN 2: not a candidate.
        locks.shard_hits[5].fetch_add(10, Ordering::Relaxed);
        assert_eq!(hottest_shard(locks, &c.map.borrow()), Some(4));
        c.map.borrow_mut().begin_move(4);
        assert_eq!(hottest_shard(locks, &c.map.borrow()), Some(7));
    }

    /// Drives a hand-over step by step: nobody serves the shard while it moves, holders are
    /// drained, then the receiver alone serves it with a table free of the old locks.
    #[test]
    fn handover_drains_then_the_receiver_alone_serves() {
        let c = cluster(3);
        let cfg = ReshardConfig::default();
        let (from, to, shard) = (1, 2, 4);
        let h1 = Holder { txn: 11, cn: 0 };
        assert!(
            c.cns[1]
                .acquire(40, shard, LockMode::Exclusive, h1)
                .is_held()
        );
        let mut h = Handover::start(&c, from, shard, to, 1_000, &cfg);
        let map = |f: &dyn Fn(&ShardMap) -> bool| f(&c.map.borrow());
        assert!(map(&|m| !m.serves(from, shard) && !m.serves(to, shard)));
        // A lock request for the shard is refused as not owned.
        let req = Request {
            kind: RequestKind::Lock,
            cn: 0,
            req: 1,
            txn: 12,
            entries: vec![LockEntry {
                key: 41,
                shard,
                mode: LockMode::Exclusive,
            }],
        };
        let (st, _) = crate::locking::apply(&c.cns[1], &c.map.borrow(), &req);
        assert_eq!(st, Status::NotOwner);
        assert_eq!(h.step(&c, 2_000), HandoverStep::Wait(cfg.poll));
        // The holder unlocks: the hand-over goes on without aborting anyone.
        assert!(c.cns[1].table.release(40, h1));
        let HandoverStep::Send(msg) = h.step(&c, 3_000) else {
            panic!("expected the message to the receiver")
        };
        assert_eq!(c.map.borrow().generation(shard), 0, "nobody aborted");
        assert!(map(&|m| !m.serves(to, shard)), "not before the message");
        let parsed = Request::parse(&msg.emit()).unwrap();
        crate::locking::receive_handover(&c, &c.cns[2], &parsed, 5_000);
        crate::locking::receive_handover(&c, &c.cns[2], &parsed, 6_000); // a repeated message changes nothing
        h.acked(&c);
        assert!(h.is_done());
        assert_eq!(h.step(&c, 7_000), HandoverStep::Done);
        assert!(map(&|m| m.serves(to, shard)
            && !m.serves(from, shard)
            && m.owner(shard) == to));
        let events = c.handovers.borrow().clone();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].interruption(), 4_000);
        assert_eq!((events[0].from, events[0].to), (from, to));
        assert_eq!(events[0].holders_left, 0);
        // The receiver grants the shard's locks; the sender holds none.
        let (st, _) = crate::locking::apply(&c.cns[2], &c.map.borrow(), &req);
        assert_eq!(st, Status::Granted);
        assert!(c.cns[1].table.slots_free());
    }

    /// After the drain timeout the holders lose their locks (the shard's generation moves,
    /// so they abort at commit), except committing ones, which are waited for.
    #[test]
    fn drain_timeout_aborts_holders_but_waits_for_committing_ones() {
        let c = cluster(2);
        let cfg = ReshardConfig {
            drain_timeout: 100,
            ..ReshardConfig::default()
        };
        let shard = 2; // CN 0's
        let (a, b) = (Holder { txn: 1, cn: 1 }, Holder { txn: 2, cn: 0 });
        assert!(c.cns[0].acquire(20, shard, LockMode::Shared, a).is_held());
        assert!(c.cns[0].acquire(20, shard, LockMode::Shared, b).is_held());
        c.committing_txns.borrow_mut().insert(b.txn);
        let mut h = Handover::start(&c, 0, shard, 1, 0, &cfg);
        assert_eq!(h.step(&c, 50), HandoverStep::Wait(cfg.poll));
        assert_eq!(h.step(&c, 100), HandoverStep::Wait(cfg.poll), "b commits");
        assert_eq!(c.map.borrow().generation(shard), 1);
        assert_eq!(c.cns[0].table.holders(20), vec![(b, LockMode::Shared)]);
        assert_eq!(h.aborted_holders, 1);
        // b finishes its commit and unlocks.
        c.committing_txns.borrow_mut().remove(&b.txn);
        assert!(c.cns[0].table.release(20, b));
        assert!(matches!(h.step(&c, 200), HandoverStep::Send(_)));
        assert!(c.cns[0].table.slots_free());
        assert!(matches!(
            c.cns[0].table.acquire(20, LockMode::Exclusive, a),
            Acquired::Granted
        ));
    }

    /// The planted bug: no drain, the holder keeps its lock while the receiver grants it
    /// again — two owners.
    #[test]
    fn without_drain_two_cns_grant_the_same_lock() {
        let c = cluster(2);
        let cfg = ReshardConfig {
            drain: false,
            ..ReshardConfig::default()
        };
        let shard = 2;
        let a = Holder { txn: 1, cn: 0 };
        assert!(
            c.cns[0]
                .acquire(20, shard, LockMode::Exclusive, a)
                .is_held()
        );
        let mut h = Handover::start(&c, 0, shard, 1, 0, &cfg);
        let HandoverStep::Send(msg) = h.step(&c, 1) else {
            panic!("no drain")
        };
        crate::locking::receive_handover(&c, &c.cns[1], &msg, 2);
        let b = Holder { txn: 2, cn: 1 };
        assert!(
            c.cns[1]
                .acquire(20, shard, LockMode::Exclusive, b)
                .is_held()
        );
        assert!(
            !c.cns[0].table.holders(20).is_empty(),
            "a still holds it too"
        );
        assert_eq!(c.handovers.borrow()[0].holders_left, 1);
        assert_eq!(
            c.map.borrow().generation(shard),
            0,
            "and a's lock stays valid"
        );
    }
}

//! The timestamp service every coordinator takes start and commit timestamps from (Motor;
//! LOTUS §5.1 uses the same service for its MVCC).
//!
//! [`TimestampService`] is a trait so that LOTUS can swap the implementation. The one here,
//! [`SyncedClock`], is **synchronised clocks with bounded uncertainty and waits** (as
//! Spanner's TrueTime and FaRMv2): every CN reads a local clock within `±epsilon` of true
//! time, so an interval `[local − ε, local + ε]` contains true time. A timestamp is the
//! interval's upper end, and the coordinator waits until the lower end has passed it, so
//! when the call returns the timestamp is in the past everywhere:
//!
//! * **start**: `S = latest`, then wait until `earliest > S`. A record found unlocked after
//!   that can only be locked by a writer whose commit timestamp is taken later, hence
//!   larger than `S` (see the crate docs for why readers wait on locks).
//! * **commit**: `C = latest` after every lock is held, then wait until `earliest > C`
//!   (commit-wait) before validating and writing: a transaction that begins after this one
//!   ended gets a larger start timestamp (real-time order, strict serializability).
//!
//! Cost on the simulated cluster: no message and no MN verb; each call waits about
//! `2 ε` (plus the CN's clock offset) of virtual time. Default `epsilon` is 1 µs.
//!
//! A timestamp is `physical_ns << 16 | coordinator`: unique per coordinator (the physical
//! part strictly increases per coordinator), so commit timestamps are unique per record and
//! serve as version numbers, and the physical part gives the GC threshold its meaning
//! (LOTUS §7.1: versions older than 500 ms are cleared).

use core::future::Future;

use dmem_layout::mix::splitmix64 as mix64;
use dmem_verbs::{Clock, Nanos, NodeId};

/// Bits of a timestamp below the physical part (the coordinator id).
pub const ID_BITS: u32 = 16;

/// The physical part (ns) of a timestamp.
#[must_use]
pub const fn physical(ts: u64) -> u64 {
    ts >> ID_BITS
}

/// The smallest timestamp whose physical part is `ns`.
#[must_use]
pub const fn at_physical(ns: u64) -> u64 {
    ns << ID_BITS
}

/// Where coordinators get timestamps.
pub trait TimestampService {
    /// A start timestamp; when it resolves, the timestamp is in the past on every CN.
    fn start_ts(&mut self) -> impl Future<Output = u64>;
    /// A commit timestamp, larger than every timestamp handed out before this call began;
    /// when it resolves, it is in the past on every CN.
    fn commit_ts(&mut self) -> impl Future<Output = u64>;
    /// A timestamp at most `age` ns older than now, for garbage collection (no wait).
    fn horizon(&self, age: Nanos) -> u64;
}

/// Synchronised clocks with uncertainty `epsilon` (see the module docs).
#[derive(Debug, Clone)]
pub struct SyncedClock<C> {
    clock: C,
    /// This CN's offset from true time, in `[-epsilon, epsilon]`.
    offset: i64,
    epsilon: Nanos,
    id: u16,
    last: u64,
    /// Virtual ns spent waiting (the service's cost).
    waited: Nanos,
}

impl<C: Clock> SyncedClock<C> {
    /// The clock of coordinator `id` on CN `node`: its offset is fixed per CN, drawn from
    /// `[-epsilon, epsilon]` by a hash of the node id (deterministic runs).
    #[must_use]
    pub fn new(clock: C, node: NodeId, id: u16, epsilon: Nanos) -> Self {
        let span = epsilon.saturating_mul(2).saturating_add(1);
        let drawn = mix64(u64::from(node.0) ^ 0x5eed_c10c) % span;
        Self {
            clock,
            offset: i64::try_from(drawn).unwrap_or(0) - i64::try_from(epsilon).unwrap_or(0),
            epsilon,
            id,
            last: 0,
            waited: 0,
        }
    }

    /// Virtual time spent waiting so far.
    #[must_use]
    pub fn waited(&self) -> Nanos {
        self.waited
    }

    fn local(&self) -> u64 {
        self.clock.now().saturating_add_signed(self.offset)
    }

    async fn take(&mut self) -> u64 {
        let latest = self.local().saturating_add(self.epsilon);
        let ts =
            (at_physical(latest) | u64::from(self.id)).max(self.last.saturating_add(1 << ID_BITS));
        self.last = ts;
        // Wait until earliest = true + offset - epsilon > physical(ts).
        let until = physical(ts)
            .saturating_add(self.epsilon)
            .saturating_add(1)
            .saturating_add_signed(-self.offset);
        let now = self.clock.now();
        if until > now {
            self.waited += until - now;
            self.clock.sleep_until(until).await;
        }
        ts
    }
}

impl<C: Clock> TimestampService for SyncedClock<C> {
    fn start_ts(&mut self) -> impl Future<Output = u64> {
        self.take()
    }

    fn commit_ts(&mut self) -> impl Future<Output = u64> {
        self.take()
    }

    fn horizon(&self, age: Nanos) -> u64 {
        at_physical(
            self.local()
                .saturating_sub(self.epsilon)
                .saturating_sub(age),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    /// A clock that jumps to the deadline when slept on.
    #[derive(Clone, Default)]
    struct Manual(Rc<Cell<Nanos>>);

    impl Clock for Manual {
        fn now(&self) -> Nanos {
            self.0.get()
        }
        fn sleep_until(&self, deadline: Nanos) -> impl Future<Output = ()> {
            if deadline > self.0.get() {
                self.0.set(deadline);
            }
            core::future::ready(())
        }
        fn cpu(&self, _ns: Nanos) {}
    }

    fn block_on<F: Future>(f: F) -> F::Output {
        let mut f = core::pin::pin!(f);
        let mut cx = core::task::Context::from_waker(core::task::Waker::noop());
        loop {
            if let core::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
        }
    }

    #[test]
    fn timestamps_are_past_everywhere_and_ordered_across_cns() {
        let eps = 1_000;
        let clock = Manual::default();
        clock.0.set(1_000_000);
        let mut a = SyncedClock::new(clock.clone(), NodeId(1), 3, eps);
        let mut b = SyncedClock::new(clock.clone(), NodeId(2), 4, eps);
        assert!(a.offset.unsigned_abs() <= eps && b.offset.unsigned_abs() <= eps);
        let mut prev = 0;
        for i in 0..100 {
            let ts = if i % 2 == 0 {
                block_on(a.commit_ts())
            } else {
                block_on(b.start_ts())
            };
            // When the call returns, true time has passed the physical part: any timestamp
            // taken afterwards, on any CN, is larger (real-time order).
            assert!(clock.now() > physical(ts), "{i}");
            assert!(ts > prev, "{i}");
            assert_eq!(ts & 0xffff, if i % 2 == 0 { 3 } else { 4 });
            prev = ts;
        }
        assert!(a.waited() > 0 && a.waited() <= 4 * eps * 50 + 50);
        assert!(a.horizon(500) < at_physical(clock.now()));
    }
}

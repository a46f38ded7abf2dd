//! Node clocks that drift (OOCC §VII-B): each node reads its own clock, with a constant
//! offset and a rate error in parts per million, through [`dmem_verbs::Clock`].
//!
//! The simulator keeps one true virtual time. [`DriftingCtx`] wraps a context (it does not
//! change the simulator) and shows the protocol the clock its node really has:
//! `local = offset + true × (1 + ppm / 10⁶)`. Sleeping until a local deadline sleeps until
//! the true instant at which the local clock reaches it. CPU costs stay true nanoseconds.
//! Histories are stamped with [`DriftingCtx::true_now`], so the checker's real-time order is
//! the simulator's, not any node's.

use core::future::Future;

use dmem_layout::mix::splitmix64;
use dmem_verbs::{
    BatchResult, Clock, Endpoint, Message, Nanos, NodeId, PostList, Verbs, VerbsError,
};

/// One node's clock error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Drift {
    /// Constant offset of the local clock, ns (may be negative).
    pub offset_ns: i64,
    /// Rate error, parts per million (positive: the clock runs fast).
    pub ppm: i64,
}

impl Drift {
    /// The local reading at true time `t`.
    #[must_use]
    pub fn local(self, t: Nanos) -> Nanos {
        let scaled = i128::from(t) * (1_000_000 + i128::from(self.ppm)) / 1_000_000;
        (scaled + i128::from(self.offset_ns)).clamp(0, i128::from(u64::MAX)) as Nanos
    }

    /// The first true time at which the local clock reads `local` or more.
    #[must_use]
    pub fn true_at(self, local: Nanos) -> Nanos {
        let rate = 1_000_000 + i128::from(self.ppm);
        let shifted = i128::from(local) - i128::from(self.offset_ns);
        if shifted <= 0 {
            return 0;
        }
        // ceil(shifted × 10⁶ / rate), then step until `local` is really reached.
        let mut t =
            ((shifted * 1_000_000 + rate - 1) / rate).clamp(0, i128::from(u64::MAX)) as Nanos;
        while self.local(t) < local {
            t += 1;
        }
        while t > 0 && self.local(t - 1) >= local {
            t -= 1;
        }
        t
    }
}

/// How every node's clock drifts in a run: seeded, within bounds, with per-node overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriftModel {
    /// Seed of the per-node draws.
    pub seed: u64,
    /// Rate errors are drawn uniformly in `[-max_ppm, max_ppm]`.
    pub max_ppm: u64,
    /// Offsets are drawn uniformly in `[-max_offset_ns, max_offset_ns]`.
    pub max_offset_ns: u64,
    /// Nodes whose drift is set rather than drawn.
    pub fixed: Vec<(NodeId, Drift)>,
}

impl Default for DriftModel {
    /// ±100 ppm (OOCC §VII-B: commodity oscillators), ±1 µs of offset, seed 1.
    fn default() -> Self {
        Self {
            seed: 1,
            max_ppm: 100,
            max_offset_ns: 1_000,
            fixed: Vec::new(),
        }
    }
}

impl DriftModel {
    /// Perfect clocks everywhere.
    #[must_use]
    pub fn none() -> Self {
        Self {
            seed: 0,
            max_ppm: 0,
            max_offset_ns: 0,
            fixed: Vec::new(),
        }
    }

    /// The same model with `node`'s drift set to `drift`.
    #[must_use]
    pub fn with(mut self, node: NodeId, drift: Drift) -> Self {
        self.fixed.retain(|(n, _)| *n != node);
        self.fixed.push((node, drift));
        self
    }

    /// `node`'s drift.
    #[must_use]
    pub fn drift_of(&self, node: NodeId) -> Drift {
        if let Some((_, d)) = self.fixed.iter().find(|(n, _)| *n == node) {
            return *d;
        }
        let r = splitmix64(self.seed ^ (u64::from(node.0) << 32));
        let draw = |x: u64, max: u64| -> i64 {
            if max == 0 {
                0
            } else {
                (x % (2 * max + 1)) as i64 - max as i64
            }
        };
        Drift {
            offset_ns: draw(splitmix64(r), self.max_offset_ns),
            ppm: draw(r, self.max_ppm),
        }
    }
}

/// A context whose [`Clock`] is its node's drifting clock; verbs pass through.
#[derive(Debug, Clone)]
pub struct DriftingCtx<C> {
    inner: C,
    drift: Drift,
}

impl<C: Clock> DriftingCtx<C> {
    /// `inner` read through `drift`.
    #[must_use]
    pub fn new(inner: C, drift: Drift) -> Self {
        Self { inner, drift }
    }

    /// The wrapped context.
    #[must_use]
    pub fn inner(&self) -> &C {
        &self.inner
    }

    /// The drift.
    #[must_use]
    pub fn drift(&self) -> Drift {
        self.drift
    }

    /// The simulator's true time (for histories only, never for protocol decisions).
    #[must_use]
    pub fn true_now(&self) -> Nanos {
        self.inner.now()
    }
}

impl<C: Clock> Clock for DriftingCtx<C> {
    fn now(&self) -> Nanos {
        self.drift.local(self.inner.now())
    }

    fn sleep_until(&self, deadline: Nanos) -> impl Future<Output = ()> {
        self.inner.sleep_until(self.drift.true_at(deadline))
    }

    fn cpu(&self, ns: Nanos) {
        self.inner.cpu(ns);
    }
}

impl<C: Verbs> Verbs for DriftingCtx<C> {
    fn local_endpoint(&self) -> Endpoint {
        self.inner.local_endpoint()
    }
    fn post(&self, list: PostList) -> impl Future<Output = Result<BatchResult, VerbsError>> {
        self.inner.post(list)
    }
    fn post_detached(&self, list: PostList) -> impl Future<Output = Result<(), VerbsError>> {
        self.inner.post_detached(list)
    }
    fn send(&self, to: Endpoint, payload: &[u8]) -> impl Future<Output = Result<(), VerbsError>> {
        self.inner.send(to, payload)
    }
    fn recv(&self) -> impl Future<Output = Result<Message, VerbsError>> {
        self.inner.recv()
    }
    fn try_recv(&self) -> Result<Option<Message>, VerbsError> {
        self.inner.try_recv()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_and_true_round_trip() {
        for d in [
            Drift {
                offset_ns: 0,
                ppm: 0,
            },
            Drift {
                offset_ns: 500,
                ppm: 100,
            },
            Drift {
                offset_ns: -700,
                ppm: -100,
            },
            Drift {
                offset_ns: 3,
                ppm: 50_000,
            },
        ] {
            for local in [0u64, 1, 999, 100_000, 123_456_789] {
                let t = d.true_at(local);
                assert!(d.local(t) >= local, "{d:?} {local}");
                assert!(t == 0 || d.local(t - 1) < local, "{d:?} {local}");
            }
        }
        let fast = Drift {
            offset_ns: 0,
            ppm: 100,
        };
        assert_eq!(fast.local(1_000_000_000), 1_000_100_000);
    }

    #[test]
    fn model_is_seeded_and_bounded() {
        let m = DriftModel::default();
        for n in 0..64 {
            let d = m.drift_of(NodeId(n));
            assert!(d.ppm.unsigned_abs() <= 100 && d.offset_ns.unsigned_abs() <= 1_000);
            assert_eq!(d, m.drift_of(NodeId(n)));
        }
        let m = m.with(
            NodeId(3),
            Drift {
                offset_ns: 0,
                ppm: 7,
            },
        );
        assert_eq!(m.drift_of(NodeId(3)).ppm, 7);
    }
}

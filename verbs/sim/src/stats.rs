//! What the simulator counts: per-NIC work and per-op latency.

use std::collections::BTreeMap;

use dmem_verbs::{Nanos, NodeId, OpKind};
use hdrhistogram::Histogram;

/// Work one node's NIC did, as responder and as requester.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NicStats {
    /// One-sided ops this NIC served as responder, by kind (indexed like [`OpKind::ALL`]).
    pub ops_served: [u64; 4],
    /// Work requests this NIC posted as requester.
    pub wrs_posted: u64,
    /// Doorbells rung on this NIC.
    pub doorbells: u64,
    /// Completion-queue entries produced (signaled work requests and errors).
    pub cqes: u64,
    /// Bytes received (requests and responses, payload and headers).
    pub bytes_in: u64,
    /// Bytes sent.
    pub bytes_out: u64,
    /// Two-sided messages sent.
    pub messages_sent: u64,
    /// Two-sided messages delivered to this node.
    pub messages_received: u64,
    /// Two-sided messages lost by fault injection or sent to a crashed node.
    pub messages_dropped: u64,
    /// Time the READ/WRITE engine was busy, ns.
    pub rw_busy_ns: f64,
    /// Time the atomic unit was busy, ns.
    pub atomic_busy_ns: f64,
    /// Time the outgoing link was busy, ns.
    pub egress_busy_ns: f64,
    /// Time the incoming link was busy, ns.
    pub ingress_busy_ns: f64,
}

impl NicStats {
    /// One-sided ops served of `kind`.
    #[must_use]
    pub fn served(&self, kind: OpKind) -> u64 {
        self.ops_served[kind_index(kind)]
    }

    /// Total one-sided ops served.
    #[must_use]
    pub fn total_served(&self) -> u64 {
        self.ops_served.iter().sum()
    }

    /// Fraction of `elapsed` during which the busiest NIC resource (READ/WRITE engine,
    /// atomic unit, either link direction) was busy: 1.0 means saturated.
    #[must_use]
    pub fn busy_fraction(&self, elapsed: Nanos) -> f64 {
        if elapsed == 0 {
            return 0.0;
        }
        let busiest = self
            .rw_busy_ns
            .max(self.atomic_busy_ns)
            .max(self.egress_busy_ns)
            .max(self.ingress_busy_ns);
        (busiest / elapsed as f64).min(1.0)
    }
}

pub(crate) fn kind_index(kind: OpKind) -> usize {
    match kind {
        OpKind::Read => 0,
        OpKind::Write => 1,
        OpKind::Cas => 2,
        OpKind::Faa => 3,
    }
}

/// Role of a node in the simulated cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Memory node.
    Memory,
    /// Compute node.
    Compute,
}

/// One node's counters.
#[derive(Debug, Clone)]
pub struct NodeStats {
    /// The node.
    pub node: NodeId,
    /// Its role.
    pub role: Role,
    /// Its NIC's work.
    pub nic: NicStats,
    /// CPU time its simulated cores spent, ns (CNs only).
    pub cpu_busy_ns: u64,
}

/// A snapshot of the simulator's statistics.
#[derive(Debug, Clone)]
pub struct SimStats {
    /// Virtual time since the simulation started, ns.
    pub elapsed_ns: Nanos,
    /// Per-node counters, indexed by node id.
    pub nodes: Vec<NodeStats>,
    /// Latency from post to completion of every one-sided work request, ns, by kind.
    pub latency: BTreeMap<OpKind, Histogram<u64>>,
    /// Events the simulator processed (its own work, for speed measurements).
    pub events: u64,
}

impl SimStats {
    /// Counters of node `node`.
    ///
    /// # Panics
    /// If `node` is not part of the cluster.
    #[must_use]
    pub fn node(&self, node: NodeId) -> &NodeStats {
        &self.nodes[usize::from(node.0)]
    }

    /// One-sided ops completed by all responders.
    #[must_use]
    pub fn total_ops(&self) -> u64 {
        self.nodes.iter().map(|n| n.nic.total_served()).sum()
    }

    /// Pairs each MN's counters now with its counters in `earlier`.
    fn memory_nodes_since<'a>(
        &'a self,
        earlier: &'a SimStats,
    ) -> impl Iterator<Item = (&'a NicStats, &'a NicStats)> {
        self.nodes
            .iter()
            .zip(&earlier.nodes)
            .filter(|(n, _)| n.role == Role::Memory)
            .map(|(n, e)| (&n.nic, &e.nic))
    }

    /// Busy fraction of the busiest resource (READ/WRITE engine, atomic unit, either link
    /// direction) of the busiest MN NIC between the snapshot `earlier` and this one: 1.0
    /// means an MN NIC was saturated for the whole interval.
    #[must_use]
    pub fn mn_busy_fraction_since(&self, earlier: &SimStats) -> f64 {
        let elapsed = self.elapsed_ns.saturating_sub(earlier.elapsed_ns);
        if elapsed == 0 {
            return 0.0;
        }
        self.memory_nodes_since(earlier)
            .map(|(n, e)| {
                let rw = n.rw_busy_ns - e.rw_busy_ns;
                let atomic = n.atomic_busy_ns - e.atomic_busy_ns;
                let egress = n.egress_busy_ns - e.egress_busy_ns;
                let ingress = n.ingress_busy_ns - e.ingress_busy_ns;
                rw.max(atomic).max(egress).max(ingress) / elapsed as f64
            })
            .fold(0.0, f64::max)
            .min(1.0)
    }

    /// One-sided ops of `kind` (all kinds for `None`) the MNs served between the snapshot
    /// `earlier` and this one.
    #[must_use]
    pub fn mn_served_since(&self, earlier: &SimStats, kind: Option<OpKind>) -> u64 {
        self.memory_nodes_since(earlier)
            .map(|(n, e)| match kind {
                Some(k) => n.served(k) - e.served(k),
                None => n.total_served() - e.total_served(),
            })
            .sum()
    }
}

/// Post-to-completion latencies, one histogram per op kind (indexed like [`OpKind::ALL`]).
///
/// Repeated values are counted in a small direct-mapped table (by the value's low bits)
/// and recorded with one `record_n` when another value takes their slot or a snapshot is
/// taken: the closed-loop clients of the deterministic model see the same few latencies
/// again and again (one per position in a list), and a compare and an increment are
/// cheaper than a histogram update (≈60 instructions). Recording is commutative, so the
/// histograms come out exactly as if every value had been recorded on its own, in order
/// (same counts, total, minimum and maximum).
pub(crate) struct LatencyRecorder {
    histograms: [Histogram<u64>; 4],
    /// Per kind and slot: a value and how many times it was seen, not yet recorded.
    pending: Box<[[(u64, u64); PENDING_SLOTS]; 4]>,
}

/// Slots of [`LatencyRecorder`]'s table per op kind.
const PENDING_SLOTS: usize = 64;

impl LatencyRecorder {
    pub(crate) fn new() -> Self {
        Self {
            histograms: new_latency(),
            pending: Box::new([[(0, 0); PENDING_SLOTS]; 4]),
        }
    }

    /// Records one latency of the kind with index `kind`. Out-of-range values saturate at
    /// the histogram's bounds (1 ns, 100 s); nothing is lost.
    #[inline]
    pub(crate) fn record(&mut self, kind: usize, value: u64) {
        let slot = &mut self.pending[kind][value as usize % PENDING_SLOTS];
        if slot.0 == value {
            slot.1 += 1;
        } else {
            let (old, count) = std::mem::replace(slot, (value, 1));
            if count > 0 {
                self.histograms[kind].saturating_record_n(old, count);
            }
        }
    }

    /// The histograms with every value recorded so far.
    pub(crate) fn snapshot(&self) -> [Histogram<u64>; 4] {
        let mut histograms = self.histograms.clone();
        for (h, slots) in histograms.iter_mut().zip(self.pending.iter()) {
            for &(value, count) in slots {
                if count > 0 {
                    h.saturating_record_n(value, count);
                }
            }
        }
        histograms
    }
}

/// Empty latency histograms, one per op kind, indexed like [`OpKind::ALL`].
fn new_latency() -> [Histogram<u64>; 4] {
    // 1 ns .. 100 s at 3 significant digits: bounded and well inside memory.
    core::array::from_fn(|_| {
        Histogram::new_with_bounds(1, 100_000_000_000, 3)
            .expect("static histogram bounds are valid")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs of equal values recorded at once give the histograms of recording each value.
    #[test]
    fn recorder_equals_recording_each_value() {
        let mut recorder = LatencyRecorder::new();
        let mut each = new_latency();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for i in 0..50_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let kind = (x % 4) as usize;
            // Long runs of one value, some changes, zero and out-of-range values.
            let value = match (x >> 8) % 16 {
                0 => x >> 20,
                1 => 0,
                2 => 200_000_000_000,
                3..=6 => 1740 + (x >> 12) % 16 * 7,
                _ => 1740 + (i / 5_000),
            };
            recorder.record(kind, value);
            each[kind].saturating_record(value);
            if i % 9_999 == 0 {
                assert_eq!(recorder.snapshot(), each);
            }
        }
        let snapshot = recorder.snapshot();
        assert_eq!(snapshot, each);
        for (a, b) in snapshot.iter().zip(&each) {
            assert_eq!(a.len(), b.len());
            assert_eq!((a.min(), a.max()), (b.min(), b.max()));
            assert_eq!(a.value_at_quantile(0.99), b.value_at_quantile(0.99));
        }
    }
}

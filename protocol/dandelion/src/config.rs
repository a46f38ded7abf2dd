//! The commit-phase skeleton's specialisations (Dandelion §4.2.3, Table 4) as data, the
//! locality knobs, and the CPU costs the layers charge.
//!
//! One commit code path (`txn.rs`) reads a [`CommitSpec`]: which replicas and which sets
//! the Locking and Replication steps visit, whether Read Validation runs, and when the
//! client is told. Dnl-4, Dnl-2, Dnl-1 and Dnl-RO are four values of it, not four copies of
//! the protocol.

use dmem_verbs::Nanos;

/// Which replicas of a key a step visits (Table 4: P, B, P & B).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replicas {
    /// The primary only.
    Primary,
    /// The backups only.
    Backups,
    /// Primary and backups.
    All,
}

/// A step that visits keys: which sets and which of their replicas (Table 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Visit {
    /// Also the read-set (R & W) rather than the write-set only (W).
    pub reads: bool,
    /// Which replicas.
    pub replicas: Replicas,
}

/// One row of Table 4: the commit phase of a protocol. Unlocking mirrors Locking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitSpec {
    /// Locking (step 1), or elided.
    pub lock: Option<Visit>,
    /// Read Validation (step 2) at the primaries of reads that were not locked.
    pub validate: bool,
    /// Replication (step 3) of the write-set, or elided.
    pub replicate: Option<Visit>,
    /// Commit is reported only once every unlock is acknowledged (else as soon as the
    /// unlocks are sent). Dnl-4's name counts the unlock round trip.
    pub commit_waits_for_unlock: bool,
    /// Abort is reported only once every unlock is acknowledged: Dnl-1, whose recovery
    /// commits a transaction that every surviving replica locked (§4.2.3, "2 rtts in aborts").
    pub abort_waits_for_unlock: bool,
}

impl CommitSpec {
    /// Dnl-4 (FaRM's protocol): lock the write-set's primaries, validate reads, replicate the
    /// write-set to the backups, unlock the primaries.
    pub const DNL_4: Self = Self {
        lock: Some(Visit {
            reads: false,
            replicas: Replicas::Primary,
        }),
        validate: true,
        replicate: Some(Visit {
            reads: false,
            replicas: Replicas::Backups,
        }),
        commit_waits_for_unlock: true,
        abort_waits_for_unlock: false,
    };

    /// Dnl-2: lock the primaries of reads and writes, replicate the write-set to every
    /// replica, unlock.
    pub const DNL_2: Self = Self {
        lock: Some(Visit {
            reads: true,
            replicas: Replicas::Primary,
        }),
        validate: false,
        replicate: Some(Visit {
            reads: false,
            replicas: Replicas::All,
        }),
        commit_waits_for_unlock: false,
        abort_waits_for_unlock: false,
    };

    /// Dnl-1: lock (and log) reads and writes at every replica, then unlock with the decision.
    pub const DNL_1: Self = Self {
        lock: Some(Visit {
            reads: true,
            replicas: Replicas::All,
        }),
        validate: false,
        replicate: None,
        commit_waits_for_unlock: false,
        abort_waits_for_unlock: true,
    };

    /// Dnl-RO: read-only transactions validate their reads, in every protocol.
    pub const DNL_RO: Self = Self {
        lock: None,
        validate: true,
        replicate: None,
        commit_waits_for_unlock: false,
        abort_waits_for_unlock: false,
    };
}

/// Bugs that can be planted for the tests and the litmus suite.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bugs {
    /// Backups never lower the readable flag during Replication, so a single-key read
    /// (GetOne) at a backup can return a write whose primary is still locked (§4.2.1).
    pub skip_readable: bool,
    /// Recovery aborts every transaction of a crashed coordinator whatever the survivors'
    /// logs say, contradicting commits already reported (§4.4).
    pub abort_crashed: bool,
    /// Servers execute every arriving request, duplicates and retransmissions included,
    /// instead of replaying the cached response (no exactly-once execution, `reliable.rs`).
    pub no_dedup: bool,
}

/// A Dandelion (or FaSST) configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DnlConfig {
    /// The commit phase of read-write transactions.
    pub commit: CommitSpec,
    /// Replication degree R (primary + R − 1 backups), capped at the number of servers.
    pub replication: u16,
    /// Many messages per packet (§5.3); off: one message per packet.
    pub network_batching: bool,
    /// Most messages in one packet (§5.3: "up to 100").
    pub max_batch: u16,
    /// Local hashtable requests executed as one prefetched batch (§6); off: one at a time.
    pub hashtable_batching: bool,
    /// Gets read a local backup (§4.3); off: only a local primary is read locally.
    pub local_reads: bool,
    /// Single-key read-only transactions commit without validation when the key was
    /// unlocked and readable (GetOne, §4.2.1).
    pub get_one: bool,
    /// Planted bugs.
    pub bugs: Bugs,
}

impl DnlConfig {
    /// `commit` with every locality optimisation on, R = 3, up to 100 messages per packet.
    #[must_use]
    pub const fn dandelion(commit: CommitSpec) -> Self {
        Self {
            commit,
            replication: 3,
            network_batching: true,
            max_batch: 100,
            hashtable_batching: true,
            local_reads: true,
            get_one: true,
            bugs: Bugs {
                skip_readable: false,
                abort_crashed: false,
                no_dedup: false,
            },
        }
    }

    /// Dnl-4.
    #[must_use]
    pub const fn dnl_4() -> Self {
        Self::dandelion(CommitSpec::DNL_4)
    }

    /// Dnl-2.
    #[must_use]
    pub const fn dnl_2() -> Self {
        Self::dandelion(CommitSpec::DNL_2)
    }

    /// Dnl-1.
    #[must_use]
    pub const fn dnl_1() -> Self {
        Self::dandelion(CommitSpec::DNL_1)
    }

    /// The FaSST baseline as this crate builds it: Dnl-4's commit (FaSST's own protocol:
    /// lock primaries, validate, log to backups, unlock — FaSST OSDI'16 §5) on the same
    /// servers, one message per packet and one hashtable request at a time. Local backups
    /// are not read (FaSST reads primaries), GetOne kept (FaSST's read-only single-key
    /// transactions also skip commit).
    #[must_use]
    pub const fn fasst() -> Self {
        Self {
            network_batching: false,
            hashtable_batching: false,
            local_reads: false,
            ..Self::dnl_4()
        }
    }

    /// Messages a packet may carry.
    #[must_use]
    pub fn batch_limit(&self) -> usize {
        if self.network_batching {
            usize::from(self.max_batch.max(1))
        } else {
            1
        }
    }
}

/// CPU the layers charge on the simulated core (the sim's NIC profile already charges each
/// packet: a work request and a doorbell at the sender, DMA of a payload past the inline
/// limit, packet-rate slot and headers on the wire, and receive CPU per packet).
pub mod cost {
    use super::Nanos;

    /// One hashtable request executed alone: 119 ns, a DLHT Get on 10M keys (8.4 Mops/s on one
    /// thread, `dmem-hashtable` README, "DLHT against the limit, 10M keys", median of 5
    /// rounds of `dmem bench hashtable --keys 10M --table dlht,limit,dlht-fast --threads 1,2
    /// --batch 1,24 --op get`). Mostly a cache miss on a random bucket.
    pub const HASHTABLE_ALONE_NS: Nanos = 119;

    /// One hashtable request in a prefetched batch: 51 ns, the same table at batch 24
    /// (19.5 Mops/s, same README row). Dandelion §6 reports the same effect (> 3× at 24).
    pub const HASHTABLE_BATCHED_NS: Nanos = 51;

    /// Per message (not per packet) CPU: copying it into or out of a packet and dispatching
    /// it to its handler. *Estimate*: Dandelion §5.3 measures up to > 10× more Gets per
    /// second with batching than with one message per packet, so a message's own cost is
    /// at most about a tenth of a packet's (the profile's cx5 packet costs ≈ 40 ns WQE +
    /// 100 ns receive + a share of a 250 ns doorbell); eRPC (NSDI'19 §6) handles ≈ 10 M
    /// small RPCs/s per core including all of that. 15 ns is inside both bounds.
    pub const MESSAGE_NS: Nanos = 15;
}

/// Round trips a request may go unanswered before it is retransmitted.
///
/// eRPC (Kalia et al., NSDI'19 §5.2.2, and `kRpcRTOUs` in its `rpc_constants.h`) uses a
/// 5 ms retransmission timeout, about 1000× its fabric's few-µs RTT: a spurious
/// retransmission there costs a session's credits and a rollback of its congestion state,
/// so it is kept rare. Here the unloaded RTT on cx5 is 1.8 µs (2 × 900 ns one-way), but a
/// loaded round trip queues behind iterations of busy server threads: at 64 contexts per
/// thread a round trip takes tens of µs (SmallBank, 5 servers: about 120 µs per
/// transaction of ≈ 2.4 round trips). 50 RTTs = 90 µs on cx5 stays above that, so the
/// fault-free path does not retransmit, while a lost message costs 90 µs instead of
/// eRPC's 5 ms, short enough for the litmus suite's 2 ms runs to recover from losses.
pub const RTO_ROUND_TRIPS: Nanos = 50;

/// The retransmission timeout for a fabric whose one-way latency is `one_way_ns`:
/// [`RTO_ROUND_TRIPS`] unloaded round trips.
#[must_use]
pub const fn retransmission_timeout(one_way_ns: Nanos) -> Nanos {
    RTO_ROUND_TRIPS * 2 * one_way_ns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_4_rows() {
        // Dnl-4: W at P; validation; replication W at B.
        let d4 = CommitSpec::DNL_4;
        assert_eq!(
            d4.lock.map(|v| (v.reads, v.replicas)),
            Some((false, Replicas::Primary))
        );
        assert!(d4.validate);
        assert_eq!(d4.replicate.map(|v| v.replicas), Some(Replicas::Backups));
        // Dnl-2: R&W at P; no validation; W at P&B.
        let d2 = CommitSpec::DNL_2;
        assert_eq!(
            d2.lock.map(|v| (v.reads, v.replicas)),
            Some((true, Replicas::Primary))
        );
        assert!(!d2.validate);
        assert_eq!(d2.replicate.map(|v| v.replicas), Some(Replicas::All));
        // Dnl-1: R&W at P&B; nothing else.
        let d1 = CommitSpec::DNL_1;
        assert_eq!(
            d1.lock.map(|v| (v.reads, v.replicas)),
            Some((true, Replicas::All))
        );
        assert!(!d1.validate && d1.replicate.is_none() && d1.abort_waits_for_unlock);
        // Dnl-RO: validation only.
        let ro = CommitSpec::DNL_RO;
        assert!(ro.lock.is_none() && ro.validate && ro.replicate.is_none());
    }

    #[test]
    fn fasst_turns_batching_off() {
        let f = DnlConfig::fasst();
        assert_eq!(f.batch_limit(), 1);
        assert!(!f.hashtable_batching && !f.local_reads);
        assert_eq!(f.commit, CommitSpec::DNL_4);
        assert_eq!(DnlConfig::dnl_4().batch_limit(), 100);
    }
}

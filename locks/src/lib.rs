//! Reader-writer locks that live in memory-node (MN) memory and are driven from compute
//! nodes (CNs) through the [`dmem_verbs`] traits.
//!
//! Every lock protocol offers the same client interface, [`RwLockClient`]: a client is one
//! coroutine with its own messaging endpoint; it acquires a lock at a [`RemoteAddr`] in
//! [`LockMode::Shared`] or [`LockMode::Exclusive`] mode and gets a [`HeldLock`] back, which
//! it hands to [`RwLockClient::release`]. Benchmarks and transaction protocols are written
//! once against the trait and swap the lock underneath.
//!
//! | protocol | module | MN state | waiting | paper |
//! |---|---|---|---|---|
//! | CAS spinlock (FORD/Sherman style, reader-writer) | [`caslock`] | one 8-byte word | CAS retries, optional backoff | DecLock §2.2 |
//! | DSLR+ | [`dslr`] | one 8-byte word of four 16-bit tickets | READ polling, truncated exponential backoff | DecLock §2.3 |
//! | ShiftLock-style MCS reader-writer lock | [`shiftlock`] | three 8-byte words | writers: hand-over messages; readers: READ polling | DecLock §2.3 |
//! | DecLock CQL | [`declock`] | 8-byte header + circular queue | one notification message | DecLock §4 |
//! | DecLock hierarchical (TF / PF) | [`declock`] + [`local`] | CQL queue of CNs | local hand-over, or one CN↔CN notification | DecLock §5 |
//!
//! Lock code is `async` and generic over `V: Verbs + Clock`; it never names an executor or
//! a backend. The decisions (what a returned lock word means, whom to notify) are plain
//! functions on plain data, tested step by step; the async code is a thin shell.
//!
//! Notifications and control messages travel between clients as fixed 32-byte
//! little-endian [`msg::LockMsg`] frames.
#![cfg_attr(not(any(test, feature = "std")), no_std)]

extern crate alloc;

pub mod caslock;
pub mod declock;
pub mod dslr;
mod error;
pub mod local;
pub mod lotus;
pub mod msg;
pub mod shiftlock;
mod sync;
mod util;

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::future::Future;

pub use dmem_layout::cql::LockMode;
pub use dmem_verbs::RemoteAddr;
use dmem_verbs::{Endpoint, Nanos, NodeId};
pub use error::LockError;
pub use util::Backoff;

/// A lock this client holds: what [`RwLockClient::release`] needs.
///
/// The same type for every protocol so that callers (benchmarks, transaction protocols)
/// can store held locks without knowing the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldLock {
    /// Address of the lock in MN memory.
    pub addr: RemoteAddr,
    /// Mode it is held in.
    pub mode: LockMode,
    /// Protocol-specific state kept from acquisition to release (a queue position, the
    /// ticket values of a DSLR+ reset duty, a ShiftLock hand-over count).
    pub(crate) token: u64,
    /// Second protocol-specific word.
    pub(crate) aux: u64,
}

impl HeldLock {
    pub(crate) const fn new(addr: RemoteAddr, mode: LockMode) -> Self {
        Self {
            addr,
            mode,
            token: 0,
            aux: 0,
        }
    }
}

/// Counters one client keeps about its own lock operations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LockStats {
    /// Acquisitions completed.
    pub acquisitions: u64,
    /// Releases completed.
    pub releases: u64,
    /// One-sided operations sent to MNs while acquiring (every work request counts).
    pub acquire_mn_ops: u64,
    /// One-sided operations sent to MNs while releasing.
    pub release_mn_ops: u64,
    /// Failed attempts or state checks while acquiring: failed CASes (CASLock), READs of a
    /// lock word that did not grant the lock (DSLR+, ShiftLock), restarts after an abort.
    pub retries: u64,
    /// DecLock: extra READs of a lock queue for obsolete entries (§4.3).
    pub refetches: u64,
    /// Notifications and control messages sent to other clients.
    pub messages_sent: u64,
    /// DecLock: lock resets this client carried out (§4.4).
    pub resets: u64,
    /// DecLock: acquisitions aborted by a reset and retried.
    pub aborts: u64,
    /// DecLock: acquisition timeouts seen (each starts a reset attempt).
    pub timeouts: u64,
    /// Notifications dropped as expired or not matching a wait (§4.4).
    pub stale_messages: u64,
    /// DecLock §5: acquisitions served by the CN's local lock without a CQL acquisition
    /// (joined a shared hold, or handed over locally with the CQL lock).
    pub local_grants: u64,
    /// DecLock §5.3: READs of a CQL queue to prefetch the earliest remote timestamp
    /// (counted in `acquire_mn_ops` too).
    pub prefetches: u64,
}

impl LockStats {
    /// Field-wise sum.
    #[must_use]
    pub fn merged(mut self, other: &Self) -> Self {
        self.acquisitions += other.acquisitions;
        self.releases += other.releases;
        self.acquire_mn_ops += other.acquire_mn_ops;
        self.release_mn_ops += other.release_mn_ops;
        self.retries += other.retries;
        self.refetches += other.refetches;
        self.messages_sent += other.messages_sent;
        self.resets += other.resets;
        self.aborts += other.aborts;
        self.timeouts += other.timeouts;
        self.stale_messages += other.stale_messages;
        self.local_grants += other.local_grants;
        self.prefetches += other.prefetches;
        self
    }
}

/// The client side of a reader-writer lock protocol: one coroutine with its own verbs
/// context and messaging endpoint.
///
/// A client acquires any number of locks, one call at a time (`&mut self`), and releases
/// each with the [`HeldLock`] it got. The futures are not `Send`: dmem executors are
/// thread-per-core.
pub trait RwLockClient {
    /// Acquires the lock at `lock` in `mode`; resolves when this client holds it.
    fn acquire(
        &mut self,
        lock: RemoteAddr,
        mode: LockMode,
    ) -> impl Future<Output = Result<HeldLock, LockError>>;

    /// Releases a lock this client holds.
    fn release(&mut self, held: HeldLock) -> impl Future<Output = Result<(), LockError>>;

    /// Stays responsive without taking locks until `deadline`: answers the control
    /// messages other clients may be waiting for (DecLock reset signals, §4.4). Protocols
    /// without such messages simply sleep.
    fn idle_until(&mut self, deadline: Nanos) -> impl Future<Output = Result<(), LockError>>;

    /// This client's counters.
    fn stats(&self) -> &LockStats;
}

/// How a protocol lays its locks out in MN memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockLayout {
    /// Bytes one lock occupies (a multiple of 8; place locks 8-byte aligned).
    pub bytes: u64,
    /// What a free lock holds: write it at every lock before use.
    pub initial: Vec<u8>,
}

/// The clients of a lock protocol, by client id: where each one's messages go. Client
/// ids are dense from 0; CQL entries and MCS tails store them (DecLock `cid`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Directory {
    endpoints: Arc<[Endpoint]>,
}

impl Directory {
    /// A directory of the given endpoints; client `i` is `endpoints[i]`.
    #[must_use]
    pub fn new(endpoints: Vec<Endpoint>) -> Self {
        Self {
            endpoints: endpoints.into(),
        }
    }

    /// The endpoint of client `id`.
    #[must_use]
    pub fn endpoint(&self, id: u32) -> Option<Endpoint> {
        self.endpoints.get(id as usize).copied()
    }

    /// Number of clients.
    #[must_use]
    pub fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// Whether there is no client.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// Every client id with its endpoint.
    pub fn iter(&self) -> impl Iterator<Item = (u32, Endpoint)> + '_ {
        self.endpoints
            .iter()
            .enumerate()
            .map(|(i, e)| (i as u32, *e))
    }
}

/// The failure detector of DecLock's reliable coordinator (§4.6, Appendix B): which nodes
/// have failed. A resetting client does not wait for answers from clients on failed nodes.
pub trait FailureDetector {
    /// Whether `node` is known to have failed.
    fn is_failed(&self, node: NodeId) -> bool;
}

/// A failure detector for runs without faults: nobody fails.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoFailures;

impl FailureDetector for NoFailures {
    fn is_failed(&self, _node: NodeId) -> bool {
        false
    }
}

/// Identifier of a lock inside messages: the MN node id above the byte offset
/// (`node << 48 | offset`).
#[must_use]
pub const fn lock_id(addr: RemoteAddr) -> u64 {
    ((addr.node.0 as u64) << 48) | (addr.offset & ((1 << 48) - 1))
}

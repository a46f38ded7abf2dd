//! LOTUS: lock disaggregation for transactions on disaggregated memory, on dmem's simulated
//! cluster and in the CN processes of a real one (each serving its own lock table,
//! [`LockCluster::of_process`]), built on Motor's CVT store and timestamp service
//! (`dmem-motor`).
//!
//! * [`shard`]: application-aware lock sharding (§4.2) and hybrid routing (§4.3).
//! * [`wire`]: lock RPC messages (§4.1).
//! * [`locking`]: each CN's lock table ([`dmem_locks::lotus`], Alg. 1) and the lock server
//!   that serves other CNs (§4.1).
//! * [`txn`]: the lock-first protocol (§5.1) under SR and SI (§5.2), a thin async shell
//!   over [`plan`]: its decisions (lock batching and routing, reads, commit planning) as
//!   plain functions and state machines.
//! * [`vtcache`]: the version table cache (§4.4).
//! * [`recovery`]: the commit log and lock-rebuild-free recovery (§6).
//! * [`restart`]: CN restart (§6): the restarted CN serves from an empty table after its
//!   broadcast.
//! * [`reshard`]: pass-by-range resharding (§4.3): load metrics in MN memory, hand-over of
//!   a hot shard.
#![forbid(unsafe_code)]

pub mod locking;
pub mod membership;
pub mod plan;
pub mod recovery;
pub mod reshard;
pub mod restart;
pub mod shard;
pub mod txn;
pub mod vtcache;
pub mod wire;

pub use dmem_motor::Isolation;
pub use locking::{CnLocks, LockCluster, serve};
pub use reshard::ReshardConfig;
pub use shard::{ShardMap, Sharding};
pub use txn::{LotusConfig, LotusCoordinator, LotusStats, LotusTxn};

/// The README's examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

//! The OOCC family on disaggregated memory: OOCC (optimistic concurrency control with
//! implicit read leases, delayed write locks, redo logs and the one-op write-unlock; OOCC
//! §III–§VI, Alg. 1), node clocks that drift (§VII-B), on the simulated cluster.
//!
//! * [`oocc`]: the protocol — decisions as plain functions ([`oocc::logic`]), a thin async
//!   shell whose post lists are Alg. 1's round trips;
//! * [`drtm`]: DrTM's lease-based shared locks (§II-A baseline), on the same store
//!   (decisions in [`drtm::logic`]);
//! * [`dslr2pl`]: two-phase locking on DSLR ticket locks (§II-A baseline), same store
//!   (decisions in [`dslr2pl::logic`]);
//! * [`store`]: records (lock word at the highest address), redo-log regions, lease lines;
//! * [`drift`]: a context wrapper that gives each node its own drifting clock;
//! * [`manager`]: the lease manager (§VII-A), two-phase adjustments, adaptive policy;
//! * [`recovery`]: a crashed CN's coordinators recovered from their redo logs.
//!
//! Deployed (as a [`dmem_deploy::Protocol`], registered as `oocc`, `drtm` and `dslr`) by
//! `dmem-protocols`, like every protocol. The OCC baseline of §II-A is FORD and is
//! registered as `occ` there.
#![forbid(unsafe_code)]

pub mod drift;
pub mod drtm;
pub mod dslr2pl;
pub mod manager;
pub mod oocc;
pub mod recovery;
mod rounds;
mod shell;
pub mod store;
mod versioned;

pub use drift::{Drift, DriftModel, DriftingCtx};
pub use oocc::{Leases, OoccConfig, OoccCoordinator, OoccTxn, Stats};

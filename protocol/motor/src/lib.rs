//! Motor: multi-versioned one-sided transactions on disaggregated memory, the baseline of
//! LOTUS (§2.2, §8), on dmem's simulated cluster.
//!
//! * [`mvcc`]: the MVCC store on the MNs, reusable by LOTUS — per record a block with
//!   Motor's header lock and a consecutive version table ([`dmem_layout::cvt`]) of `N` cells
//!   (chosen per table at run time), cacheline-versioned images ([`dmem_layout::cacheline`]),
//!   replicated on a primary and backups, found through `dmem-store`'s index; the loader;
//!   the MN memory a data set needs before anything is allocated; GC (LOTUS §7.1).
//! * [`oplog`]: each coordinator's locked records and commit installs, in memory that
//!   survives a CN crash (Motor's UPS-backed DRAM); [`recovery`] finishes a crashed
//!   coordinator's transaction from it.
//! * [`ts`]: the timestamp service trait and its implementation (synchronised clocks with
//!   bounded uncertainty and waits).
//! * [`logic`]: Motor's decisions as plain functions (version choice, aborts, commit plan).
//! * [`exec`]: the execution pieces Motor's and LOTUS's transactions share (read and write
//!   sets, bucket lookups, a commit's replica WRITEs).
//! * [`txn`]: the coordinator and transaction, a thin async shell that posts and decides
//!   through [`logic`].
#![forbid(unsafe_code)]

pub mod exec;
pub mod logic;
pub mod mvcc;
pub mod oplog;
pub mod recovery;
pub mod ts;
pub mod txn;

pub use logic::Isolation;
pub use mvcc::{BlockShape, Footprint, Meta, MvccLoader, Shapes, cells_for_workload};
pub use oplog::{OpLog, OpLogDecodeError, OpLogMirror, OpLogs};
pub use recovery::{Recovered, RecoveryError, recover_coordinator};
pub use ts::{SyncedClock, TimestampService};
pub use txn::{
    MotorConfig, MotorCoordinator, MotorStats, MotorTxn, incarnation_seq_base, read_final,
};

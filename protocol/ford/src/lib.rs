//! FORD and Pandora: one-sided OCC transactions on disaggregated memory.
//!
//! * [`store`]: `dmem-store` re-exported — placement of records on a primary and `f` backup
//!   MNs, the MN hash index (one READ per bucket), the out-of-band [`Loader`],
//!   per-coordinator log regions and the CN-side [`AddressCache`],
//!   shared with the other one-sided protocols.
//! * [`config`]: [`Protocol::Ford`](config::Protocol) with each of the six bugs of Pandora
//!   Table 1 behind its own switch ([`FordBug`]), or
//!   [`Protocol::Pandora`](config::Protocol).
//! * [`logic`]: the decisions (lock views and PILL stealing, validation, recovery's roll
//!   forward / roll back) as plain functions.
//! * `state` and `round` (private): a transaction's sets and one execution round as plain
//!   data, with every decision over them that needs no fabric, FORD's six bug switches
//!   included (which locks an abort releases, whether the insert is logged, where a
//!   commit's validation and logs go, ...): the shell asks these, never a switch itself.
//! * [`txn`]: [`FordCoordinator`] and its transactions, implementing
//!   `dmem_txn::{Coordinator, Transaction}` and recording every transaction into a
//!   [`HistorySink`].
//! * [`recovery`]: heartbeat failure detector, active-link termination, log recovery,
//!   truncation and stray-lock notification (Pandora §3.2), FORD's stray-lock scan, and
//!   the detector's side of MN failures (§3.2.5).
//! * [`mnfail`]: MN failures on the CNs (§3.2.5): view epochs, pause, stop-and-decide of
//!   in-flight transactions, acknowledgement and resume.
//! * [`cores`]: a CN process on several cores (thread per core): its listener's control
//!   messages forwarded to every core's coordinators, the acknowledgement of an MN view
//!   sent once every core can give it.
//!
//! Protocol code is generic over `V: Verbs + Clock` and never names an executor.
#![forbid(unsafe_code)]

pub mod cn;
pub mod config;
pub mod cores;
pub mod logic;
pub mod mnfail;
pub mod recovery;
mod round;
mod state;
/// The MN-side store, index, loader and address cache, shared by every one-sided protocol
/// and now living in `dmem-store`; re-exported so `crate::store::…` paths keep working.
pub mod store {
    pub use dmem_store::*;
}
pub mod txn;
pub mod wire;

pub use cn::CnShared;
pub use config::{BugSet, FordBug, Protocol, ProtocolConfig};
pub use dmem_txn::{HistorySink, NoHistory};
pub use recovery::{
    FailureDetector, LinkTerminator, Member, MnFailureEvent, RecoveryError, RecoveryEvent,
    RecoveryManager,
};
pub use store::{AddressCache, Loader, Store, StoreConfig, StoreError, TableSpec};
pub use txn::{CoordinatorStats, FordCoordinator, FordTxn};

//! The rdma fabric of dmem: `dmem_verbs::Verbs` on RDMA NICs through libibverbs.
//!
//! Split in two, so that everything a device does not decide is tested without one:
//!
//! | module | what | needs a device |
//! |---|---|---|
//! | [`descriptor`] | the connection descriptor (node id, region address/length/rkey, QP number, PSN, LID, GID, MTU): a 56-byte little-endian layout on `dmem_layout::bytes`, checked parsing, exchange over a byte stream | no |
//! | [`qp`] | the RC queue pair's RESET → INIT → RTR → RTS state machine with the attributes each transition sets | no |
//! | [`chain`] | a `PostList` as chains of work requests: one doorbell per queue pair, selective signaling, inline WRITEs, staging layout (atomics 8-aligned), send-queue splitting | no |
//! | [`completion`] | routing completions (by `wr_id`) to the posts waiting for them | no |
//! | [`msg`] | two-sided message frames | no |
//! | `device` (feature `device`) | `RdmaDevice`, `RdmaContext` (implements `Verbs`), memory registration, over `sideway` | yes |
//! | `server` (feature `device`) | `RdmaMemoryServer`: an MN process hands its region to CN contexts over TCP; `connect_memory`, revocation | yes |
//!
//! Papers: doorbell batching (LOTUS §7.2, Pandora §2.3), selective signaling (DecLock §6),
//! RC one-sided verbs and atomics as FORD and Motor use them.
//!
//! The device code runs on Linux soft-RoCE (`rdma_rxe`) with stock rdma-core (CI boots it
//! in a VM: `ci/rxe-vm.sh`); it has not run on an RNIC yet. See the README.
#![cfg_attr(not(feature = "device"), forbid(unsafe_code))]

pub mod chain;
pub mod completion;
pub mod descriptor;
pub mod msg;
pub mod qp;

#[cfg(feature = "device")]
pub mod device;
#[cfg(feature = "device")]
pub mod server;

pub use chain::{ChainLimits, ChainPlan, RegionTable, build_chains};
pub use descriptor::{QpEndpoint, RdmaDescriptor, RegionDescriptor, exchange};
pub use qp::{QpConfig, QpMachine, QpState};

/// Why the rdma fabric could not start or connect.
#[derive(Debug, thiserror::Error)]
pub enum RdmaError {
    /// No RDMA device is usable on this host.
    #[error("no RDMA device found ({0})")]
    NoDevice(String),
    /// A libibverbs call failed.
    #[error("{call} failed: {detail}")]
    Ibverbs {
        /// Which call.
        call: &'static str,
        /// What it said.
        detail: String,
    },
    /// A queue-pair transition was refused before it reached the device.
    #[error(transparent)]
    QpState(#[from] qp::QpStateError),
    /// The descriptor exchange failed.
    #[error(transparent)]
    Exchange(#[from] descriptor::ExchangeError),
    /// A size that would not fit.
    #[error("{0}")]
    Size(String),
}

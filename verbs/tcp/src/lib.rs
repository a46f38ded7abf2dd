//! The tcp verbs fabric (ARCHITECTURE.md, "Fabrics", item 3): one-sided verbs for hosts
//! without RDMA NICs, so that dmem runs across ordinary machines.
//!
//! - **Memory node** ([`TcpMemoryServer`]): registers its memory (a [`ShmMemoryNode`]: a
//!   sealed memfd mapping) and serves READ/WRITE/CAS/FAA on it from one io_uring loop. The
//!   ops are executed by the shared-memory fabric's code, so they are real CPU atomics with
//!   the same semantics as on `dmem-shm`: WRITEs land in increasing address order, atomics
//!   are `SeqCst` on 8-byte aligned words, and one connection executes in order.
//! - **Compute node** ([`TcpFabric`], [`TcpContext`], which implements
//!   [`dmem_verbs::Verbs`]): one TCP connection per context and MN is its queue pair; a post
//!   list to one MN travels as **one frame** (doorbell batching is one `write`), the
//!   completion comes back as one frame; two-sided messages go CN to CN over TCP.
//! - **Wire format** ([`wire`]): `#[repr(C)]` zerocopy records, little-endian, parsed in
//!   place with every length checked; a malformed or oversized frame is refused with a
//!   typed [`WireError`], never a panic.
//! - **Revocation** ([`TcpMemoryServer::revoke`], Pandora §3.2.2 active-link termination):
//!   the MN cuts the CN's link to the memory, shuts its connections down and refuses its
//!   later hellos; the CN's posts then fail with `ConnectionLost` or `RemoteAccess`.
//!
//! # Example
//!
//! ```
//! use dmem_shm::ShmMemoryNode;
//! use dmem_tcp::{TcpFabric, TcpMemoryServer};
//! use dmem_verbs::{NodeId, Port, RKey, VerbsExt};
//!
//! let mn = ShmMemoryNode::create(NodeId(0), RKey(7), 4096)?;
//! let server = TcpMemoryServer::serve(mn, "127.0.0.1:0".parse()?)?;
//!
//! let fabric = TcpFabric::new(NodeId(1));
//! let mut ctx = fabric.context(Port(1))?;
//! let region = ctx.connect(server.local_addr())?;
//! let word = region.at(64).unwrap();
//! let executor = dmem_runtime::Executor::new();
//! let old = executor.block_on(async { ctx.faa(word, 5).await })?;
//! assert_eq!(old, 0);
//! assert_eq!(executor.block_on(ctx.read(word, 8))?, 5u64.to_ne_bytes());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`ShmMemoryNode`]: dmem_shm::ShmMemoryNode

mod client;
mod error;
mod fabric;
mod server;
pub mod wire;

pub use client::CONNECT_TIMEOUT;
pub use error::TcpError;
pub use fabric::{MessageListener, TcpContext, TcpFabric};
pub use server::TcpMemoryServer;
pub use wire::WireError;

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

//! The shared-memory verbs fabric (ARCHITECTURE.md, "Fabrics", item 2): real time, real
//! threads and processes, CXL-like.
//!
//! A memory node ([`ShmMemoryNode`]) owns a sealed memfd mapped shared; one-sided verbs are
//! real atomics on that mapping, executed by the CN thread itself, so posts complete on
//! their first poll. CN contexts ([`ShmContext`], which implements [`dmem_verbs::Verbs`])
//! reach memory nodes through [`MnLink`]s:
//!
//! - **same process**: [`ShmMemoryNode::link`];
//! - **other process on the host**: the memory node's process calls
//!   [`ShmMemoryNode::serve`] on a Unix socket path; the CN process calls
//!   [`MnLink::connect`], which receives the memfd through `SCM_RIGHTS` together with the
//!   region description (node id, rkey, length) and a link slot, and maps it.
//!
//! # Soundness
//!
//! The memory is shared with other threads and processes, so it is never touched by plain
//! loads or stores, never borrowed as `&[u8]`, and only accessed by aligned 8-byte atomics
//! (unaligned WRITE edges are merged with a compare-exchange loop rather than with byte
//! atomics, because racing atomics of different sizes are not allowed by Rust's memory
//! model). The orderings, and what they give (a WRITE lands line by line, in increasing address
//! order, each line whole; a READ is a snapshot with respect to WRITEs, through a seqlock word
//! per write stripe), are argued in the `ops` module; the validity of the mapping in the
//! `mapping` module (the memfd is sealed against shrinking, so no process can make an access
//! fault).
//!
//! # Revocation
//!
//! [`ShmMemoryNode::revoke`] cuts every link of one CN (Pandora §3.2.2, active-link
//! termination): later posts through them complete with [`VerbsError::RemoteAccess`] and
//! touch nothing.
//!
//! [`VerbsError::RemoteAccess`]: dmem_verbs::VerbsError::RemoteAccess
//!
//! The revoked flags live in control lines of the shared file, so this works
//! for CNs in other processes too. It is cooperative, as all shared memory is: a CN process
//! that does not run this crate's code could ignore it (RDMA enforces it in the NIC).
//!
//! # Messages
//!
//! Two-sided messages go through a [`ShmFabric`]: directly between contexts of one process
//! (a registry of receive queues keyed by [`Endpoint`](dmem_verbs::Endpoint); `recv` leaves
//! its waker with the queue and the sender wakes it), and between processes of the host over
//! one Unix socket per receiving node in a shared directory
//! ([`ShmFabric::serve_messages`], [`ShmFabric::set_message_dir`]).
//!
//! # Clock
//!
//! This crate implements only [`Verbs`](dmem_verbs::Verbs). The real-time clock
//! (`CLOCK_MONOTONIC`, which all processes of a host share) and the executor live in
//! `dmem-runtime`.
//!
//! # Example
//!
//! ```
//! use dmem_shm::{ShmFabric, ShmMemoryNode};
//! use dmem_verbs::{Endpoint, NodeId, Port, RKey, VerbsExt};
//!
//! let mn = ShmMemoryNode::create(NodeId(0), RKey(7), 4096)?;
//! let fabric = ShmFabric::new();
//! let mut cn = fabric.context(Endpoint { node: NodeId(1), port: Port(0) })?;
//! cn.add_link(mn.link(NodeId(1))?)?;
//!
//! let word = mn.region().at(64).unwrap();
//! // Posts are ready on their first poll, so any executor (or a no-op waker) drives them.
//! let old = poll_once(cn.faa(word, 5)).unwrap();
//! assert_eq!(old, 0);
//! assert_eq!(poll_once(cn.read(word, 8)).unwrap(), 5u64.to_ne_bytes());
//!
//! fn poll_once<F: std::future::Future>(f: F) -> F::Output {
//!     let mut f = std::pin::pin!(f);
//!     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
//!     match f.as_mut().poll(&mut cx) {
//!         std::task::Poll::Ready(v) => v,
//!         std::task::Poll::Pending => unreachable!("shm posts complete on first poll"),
//!     }
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod context;
mod error;
mod mapping;
mod node;
mod ops;
mod remote;
mod socket;

pub use context::{MAX_MESSAGE, Recv, ShmContext, ShmFabric};
pub use error::ShmError;
pub use mapping::{HugePages, MAX_LINKS, shmem_thp_policy};
#[cfg(feature = "rdma")]
pub use node::RdmaRegistration;
pub use node::{MnLink, ShmMemoryNode};
pub use ops::{STALL_LIMIT, stalls};
pub use remote::{MessageServer, message_socket};
pub use socket::ShmServer;

//! Zero-copy layouts for transactions and locks on disaggregated memory.
//!
//! Every type here is the byte image of something that lives in memory-node (MN) memory,
//! in a compute node's (CN) registered buffer, or on the wire between nodes. Types are
//! `#[repr(C)]` with [`zerocopy`] derives, their size and alignment are fixed by
//! `static_assertions`, and multi-byte fields are stored **little-endian**.
//!
//! # Byte order and what an RDMA atomic sees
//!
//! A dmem cluster is homogeneous: every CN and MN is little-endian (x86-64 or AArch64), and
//! RDMA atomics (CAS, FAA) operate on an 8-byte word in the responder's native byte order.
//! The 8-byte words that atomics touch (CQL headers, PILL lock words, LOTUS lock slots) are
//! therefore stored as little-endian `u64`, which is both the wire order and the order the
//! NIC's atomic unit adds and compares in. Storing them as `zerocopy::little_endian::U64`
//! makes the choice explicit and keeps a big-endian host honest (it would byte-swap on
//! every access, which is correct for memory shared with little-endian peers).
//!
//! # Untrusted bytes
//!
//! Bytes that came from the network or from remote memory are parsed through checked
//! constructors (`*::parse`, `try_ref_from_bytes`, ...) that return a typed error and never
//! panic. Once a view is constructed, no accessor panics.
//!
//! # Modules and the papers they implement
//!
//! | module | layout | paper |
//! |---|---|---|
//! | [`cacheline`] | cacheline-versioned record image | LOTUS §7.1 (after FaRM) |
//! | [`cvt`] | consecutive version table | LOTUS §7.1 Fig. 11, Motor |
//! | [`cql`] | CQL lock header and queue entry | DecLock §4.1 Fig. 5, §5.1 Fig. 9 |
//! | [`pill`] | PILL lock word, failed-coordinator set | Pandora §3.1.2 |
//! | [`lock_slot`] | LOTUS lock slot and bucket | LOTUS §4.1 Alg. 1 |
//! | [`record`] | one-sided records, MN hash bucket | FORD/Pandora §2.3, OOCC §V |
//! | [`kv_meta`] | Dandelion key-value metadata word | Dandelion Table 3 |
//! | [`log`] | log region header, undo/redo/commit records | Pandora §3.1.3, OOCC §V, LOTUS §6 |
//! | [`rpc`] | batched RPC frame | Dandelion §5 |
//!
//! [`bytes`] is the checked little-endian reader and writer of every hand-written wire
//! format above this crate (one `parse`/`emit` convention for all of them).
#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![forbid(unsafe_code)]

#[cfg(feature = "alloc")]
extern crate alloc;

mod bits;
pub mod bytes;
pub mod cacheline;
pub mod cql;
pub mod cvt;
pub mod error;
pub mod kv_meta;
pub mod lock_slot;
pub mod log;
pub mod mix;
pub mod pill;
pub mod record;
pub mod rpc;

pub use error::LayoutError;

/// Size of a cache line on every machine dmem targets, and the unit in which an RDMA
/// WRITE lands at the responder (LOTUS §7.1; ARCHITECTURE.md, "Fabrics").
pub const CACHE_LINE: usize = 64;

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

//! A DLHT-style concurrent hashtable with batched prefetching (Dandelion §6; DLHT, HPDC '24).
//!
//! * [`Dlht`]: `u64 → u64` with inline values — the fast path for lock tables, version-table
//!   caches and address caches. Closed addressing with 64-byte buckets and bounded
//!   cache-line chaining (the layout is drawn in `raw.rs`), lock-free Gets, per-bin seqlocked
//!   writes, deletes that free their slot at once, a non-blocking cooperative resize, a batch
//!   API that prefetches every request's bucket first, an iterator, and memory statistics.
//! * [`BoxedMap`]: any `K: Hash + Eq → V` through one indirection, with epoch-based reclamation
//!   of replaced and removed records.
//!
//! `no_std` + `alloc` without the default `std` feature; `std` adds huge pages and page
//! statistics. Build with `RUSTFLAGS="--cfg loom"` to model-check the same code with loom.
#![cfg_attr(not(any(test, feature = "std")), no_std)]

extern crate alloc;

mod boxed;
mod hash;
#[cfg(all(test, not(loom)))]
mod lincheck_tests;
mod mem;
mod primitive;
mod raw;
mod reclaim;
mod table;

pub use boxed::{BoxedGuard, BoxedMap};
pub use hash::{WordHasher, WordHasherBuilder, mix64};
#[cfg(not(loom))]
pub use mem::WordArray;
pub use mem::{HUGE_PAGE, PageKind};
#[cfg(all(feature = "std", target_os = "linux"))]
pub use mem::{anon_huge_bytes, thp_policy};
pub use raw::{MemoryUsage, Sizing};
pub use table::{Dlht, Guard, Iter, Op, Options, PREFETCH_WINDOW, Request};

/// Most entries one bin holds (3 inline, 4 in a chained line, 12 in a chained bucket of three
/// lines).
pub const BIN_SLOTS: usize = raw::BIN_SLOTS;

//! Verbs for disaggregated memory, shaped like ibverbs.
//!
//! A compute node (CN) reaches memory nodes (MNs) with one-sided work requests (READ, WRITE,
//! CAS, FAA) and other nodes with two-sided messages. This crate holds the types and traits
//! that lock and protocol code is written against; backends implement them:
//!
//! | backend | crate | time |
//! |---|---|---|
//! | deterministic simulated cluster with a NIC cost model | `dmem-sim` | virtual |
//! | shared memory (threads or processes on one host, CXL-like) | `dmem-shm` | real |
//! | RDMA NICs through libibverbs | `dmem-rdma` (device part behind a feature) | real |
//!
//! # Doorbell batching and selective signaling
//!
//! A [`PostList`] chains work requests; [`Verbs::post`] rings **one doorbell per destination
//! queue pair** for the whole list (LOTUS §7.2, FORD's CAS+READ), which is where batching
//! saves CPU and PCIe work. Only work requests marked *signaled* produce a completion-queue
//! entry (**selective signaling**); by default the builder signals the last work request to
//! each destination, which is enough because a reliable-connected queue pair executes in
//! order. Every work request still gets its [`WrOutcome`] (a READ's bytes land in the local
//! buffer whether or not it was signaled), and an error always completes, as in ibverbs.
//!
//! # Futures, not callbacks
//!
//! [`Verbs::post`] returns a future that resolves when every signaled completion of the list
//! has arrived; the executor that polls it drives the completion queue. Traits use
//! `async fn`-style methods without `Send` bounds because every dmem executor is
//! thread-per-core: a task never migrates.
#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![forbid(unsafe_code)]

extern crate alloc;

mod addr;
mod clock;
mod error;
mod phase;
#[cfg(feature = "std")]
pub mod sync;
mod wait;
mod wr;

pub use addr::{Endpoint, MemoryRegion, NodeId, Port, RKey, RemoteAddr};
pub use clock::{Clock, Nanos};
pub use error::VerbsError;
pub use phase::Phase;
pub use wait::recv_until;
pub use wr::{
    BatchResult, Message, Op, OpKind, PostList, READ_INLINE_BYTES, ReadBytes, WorkRequest,
    WorkRequests, WrId, WrOutcome,
};

use core::future::Future;

/// The one-sided and two-sided verbs of one CN execution context (a thread and its queue
/// pairs to every node).
///
/// Implemented by every backend. Lock and protocol code is generic over it and never names a
/// backend or an executor.
pub trait Verbs {
    /// The messaging endpoint of this context; other nodes [`send`](Verbs::send) to it.
    fn local_endpoint(&self) -> Endpoint;

    /// Posts every work request of `list`, one doorbell per destination queue pair, and
    /// resolves when all of them have completed.
    ///
    /// Bad input (a misaligned atomic, an empty list) is refused before anything is posted.
    /// A failed work request makes the whole result an error that names it; work requests
    /// before it on the same queue pair have landed, as on a reliable connection.
    fn post(&self, list: PostList) -> impl Future<Output = Result<BatchResult, VerbsError>>;

    /// Posts every work request of `list` and resolves once they are posted, without
    /// waiting for their completions: unsignaled work requests whose outcome the caller
    /// does not need (FORD releases its commit locks this way, `CheckCommitAll` in its
    /// `dtx_check.cc`). They still execute in order on their queue pairs, so a later post
    /// to the same node lands after them; if one fails, nobody is told.
    ///
    /// The default waits for the completions like [`post`](Verbs::post) (correct, one
    /// round trip slower); backends that can post without a waiter override it.
    fn post_detached(&self, list: PostList) -> impl Future<Output = Result<(), VerbsError>> {
        async move { self.post(list).await.map(|_| ()) }
    }

    /// Notes that the protocol is about to post the work requests of phase `phase` (e.g.
    /// [`Phase::Log`], [`Phase::Commit`]). Nothing on real fabrics; the simulator records the work-request
    /// index where each phase began, so that fault injection can aim crashes at phase
    /// boundaries and inside batches instead of uniformly (the litmus suite does).
    fn mark_phase(&self, phase: Phase) {
        let _ = phase;
    }

    /// Sends a two-sided message to `to`. Resolves once the message is handed to the NIC;
    /// delivery is not acknowledged (a lost message is the protocol's business).
    fn send(&self, to: Endpoint, payload: &[u8]) -> impl Future<Output = Result<(), VerbsError>>;

    /// Sends several two-sided messages at once; on a NIC this is one doorbell for all of
    /// their work requests (doorbell batching, eRPC NSDI'19 §4.1). The default sends them
    /// one after the other; backends that model doorbells override it.
    fn send_batch(
        &self,
        messages: alloc::vec::Vec<(Endpoint, alloc::vec::Vec<u8>)>,
    ) -> impl Future<Output = Result<(), VerbsError>> {
        async move {
            for (to, payload) in &messages {
                self.send(*to, payload).await?;
            }
            Ok(())
        }
    }

    /// Receives the next message addressed to [`local_endpoint`](Verbs::local_endpoint).
    fn recv(&self) -> impl Future<Output = Result<Message, VerbsError>>;

    /// Returns a message that has already arrived, if any, without waiting.
    fn try_recv(&self) -> Result<Option<Message>, VerbsError>;
}

/// Single-operation helpers over [`Verbs::post`]; each posts one signaled work request.
pub trait VerbsExt: Verbs {
    /// READs `len` bytes at `addr`.
    fn read(
        &self,
        addr: RemoteAddr,
        len: u32,
    ) -> impl Future<Output = Result<alloc::vec::Vec<u8>, VerbsError>> {
        let mut list = PostList::new();
        let id = list.read(addr, len);
        async move { Ok(self.post(list).await?.take_bytes(id)) }
    }

    /// WRITEs `data` at `addr`.
    fn write(&self, addr: RemoteAddr, data: &[u8]) -> impl Future<Output = Result<(), VerbsError>> {
        let mut list = PostList::new();
        list.write(addr, data);
        async move { self.post(list).await.map(|_| ()) }
    }

    /// Compare-and-swap of the 8-byte word at `addr`; returns the value it held before.
    /// The swap happened iff the returned value equals `expect`.
    fn cas(
        &self,
        addr: RemoteAddr,
        expect: u64,
        swap: u64,
    ) -> impl Future<Output = Result<u64, VerbsError>> {
        let mut list = PostList::new();
        let id = list.cas(addr, expect, swap);
        async move { Ok(self.post(list).await?.atomic(id)) }
    }

    /// Fetch-and-add on the 8-byte word at `addr` (wrapping); returns the value it held before.
    fn faa(&self, addr: RemoteAddr, add: u64) -> impl Future<Output = Result<u64, VerbsError>> {
        let mut list = PostList::new();
        let id = list.faa(addr, add);
        async move { Ok(self.post(list).await?.atomic(id)) }
    }
}

impl<V: Verbs + ?Sized> VerbsExt for V {}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

//! Dandelion (DNL): a replicated transactional key-value store over batched two-sided RPCs
//! on a small deployment of symmetric servers, and its FaSST baseline.
//!
//! Every server is both coordinator and storage: it keeps the records it replicates
//! (primary or backup, placed by hash, R = 3) in its own memory, in `dmem-hashtable` tables
//! with Table 3's metadata word per key, and reaches the other servers only through RPCs
//! that the networking layer batches into packets.
//!
//! | module | paper | what |
//! |---|---|---|
//! | [`config`] | §4.2.3, Table 4, §4.3, §5.3, §6 | the commit skeleton's specialisations as data (Dnl-4, Dnl-2, Dnl-1, Dnl-RO), locality knobs, FaSST, the CPU costs with their sources |
//! | [`wire`] | §4.2 | the protocol's messages, with checked parsing |
//! | [`store`] | §4.2, Table 3, §6 | a server's records, request handler, undo/redo log |
//! | [`net`] | §5.1, §5.3 | flows, `TryInsert`, `TryInsertMcast`, packets of up to N messages as `dmem-layout` RPC frames |
//! | [`reliable`] | §5 (eRPC) | request numbers per session, retransmission after a timeout, exactly-once execution with cached responses |
//! | [`worker`] | §4.1, §5.1 | a server thread's `RunIteration` loop, placement, cluster state |
//! | [`txn`] | §3, §4.2 | transaction contexts behind dmem's rounds API; execution and the commit skeleton |
//!
//! The deployment on the simulated cluster (every CN a server) is in `dmem-protocols`
//! (`dnl-4`, `dnl-2`, `dnl-1`, `fasst`); see the README for figures and deviations.
#![forbid(unsafe_code)]

pub mod cluster;
mod commit;
pub mod config;
pub mod net;
pub mod recovery;
pub mod reliable;
pub mod store;
pub mod survivor;
pub mod txn;
pub mod wire;
pub mod worker;

pub use config::{Bugs, CommitSpec, DnlConfig, Replicas, Visit, retransmission_timeout};
pub use net::{Flow, Net};
pub use recovery::{
    Answers, Gathered, Phase, Planned, Query, RecoveryCost, RecoveryReport, Rules, answer, halt,
    page, page_budget, plan, queries, query_requests, recover, requests, survivor_state,
};
pub use store::ServerStore;
pub use txn::{DnlCoordinator, DnlTxn, TxnStats};
pub use worker::{Cluster, Placement, Step, Worker, WorkerStats};

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

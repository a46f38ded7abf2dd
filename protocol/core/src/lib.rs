//! The transaction core shared by every dmem protocol.
//!
//! * [`model`]: tables, keys, versions, coordinators: the data model of Pandora §2 / LOTUS §3
//!   (records with a primary and backups on MNs, addressed by table and 64-bit key).
//! * [`api`]: the coordinator API every protocol implements — async begin, rounds of reads
//!   (read-only or for update, issued together), write, insert, delete, commit, abort — so a
//!   workload is written once and the protocol is chosen at run time.
//! * [`history`]: what every protocol records (each read with the version it observed, each
//!   write with the version it installed, begin and end instants, outcome), for the checker.
//! * [`checker`]: the one history checker every protocol uses (Adya's G0, G1a–c, G-single, G2,
//!   plus real-time order for strict serializability; Pandora §5), and its list-append
//!   front end ([`checker::append`]) that infers the dependencies from observed values alone.
//! * [`detector`]: the heartbeat failure detector as a state machine (which CNs fell silent
//!   for longer than a timeout), for every recovery that needs one.
#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![forbid(unsafe_code)]

extern crate alloc;

pub mod abort;
pub mod api;
pub mod checker;
pub mod detector;
pub mod history;
pub mod model;

pub use abort::AbortReason;
pub use api::{
    Access, BoxCoordinator, BoxTransaction, Coordinator, DynCoordinator, DynTransaction, ReadReq,
    RoundPlan, RoundValues, Transaction, TxnError,
};
pub use checker::append::{
    AppendAnomaly, AppendKind, AppendReport, AppendTxn, MicroOp, check_append,
};
pub use checker::{
    Anomaly, AnomalyKind, CheckOptions, CycleClass, Isolation, Report, SegmentedCheck, check,
    check_with,
};
pub use history::{History, HistorySink, NoHistory, ReadEvent, TxnOutcome, TxnRecord, WriteEvent};
pub use model::{CoordinatorId, CriticalField, Key, TableId, TxnId, TxnKind, Version, WriteKind};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

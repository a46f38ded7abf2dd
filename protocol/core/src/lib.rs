//! The transaction core shared by every dmem protocol.
//!
//! * [`model`]: tables, keys, versions, coordinators: the data model of Pandora §2 / LOTUS §3
//!   (records with a primary and backups on MNs, addressed by table and 64-bit key).
//! * [`api`]: the coordinator API every protocol implements — begin, read, read-for-update,
//!   write, insert, delete, commit, abort — so a workload is written once and the protocol is
//!   chosen at run time.
//! * [`history`]: what every protocol records (each read with the version it observed, each
//!   write with the version it installed, begin and end instants, outcome), for the checker.
#![cfg_attr(not(any(test, feature = "std")), no_std)]

extern crate alloc;

pub mod api;
pub mod history;
pub mod model;

pub use api::{Coordinator, Transaction, TxnError};
pub use history::{History, ReadEvent, TxnOutcome, TxnRecord, WriteEvent};
pub use model::{CoordinatorId, Key, TableId, TxnId, TxnKind, Version, WriteKind};

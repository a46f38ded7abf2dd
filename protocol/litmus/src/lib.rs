//! Pandora's litmus tests (§5, Fig. 5) as a reusable suite with crash injection.
//!
//! * [`litmus`]: litmus 1 (direct-write cycles, with insert and delete variants), 2
//!   (read-write cycles) and 3 (indirect-write cycles): keys, initial states, the
//!   transactions written once against [`dmem_txn::Transaction`], and the
//!   application-level assertions of Fig. 5.
//! * The protocol under test is any [`dmem_deploy::Protocol`] (looked up by name in
//!   `dmem_protocols::registry()`): the suite builds its store and coordinators through
//!   [`dmem_deploy::Deployment`] and lets it run its own recovery, so it names no
//!   protocol's types.
//! * [`run`]: one run ([`run_one`]: cluster, concurrent transactions with seeded delays
//!   and schedule steering ([`Steer`]), delayed messages, a crash "after any operation" —
//!   at a work request of a worker CN aimed at a phase the protocol marked
//!   (`Verbs::mark_phase`) or chosen uniformly — recovery, the assertion transaction, and
//!   [`dmem_txn::check`] on the history) and a suite over many seeds ([`run_suite`]).
//!
//! A run is a function of its seed: the same seed replays the same interleaving, crash
//! and recovery.
//!
//! ```
//! use dmem_litmus::{Litmus, RunConfig, run_one};
//!
//! let pandora = dmem_protocols::registry().get("pandora").unwrap();
//! let out = run_one(&*pandora, Litmus::IndirectWrite, 7, &RunConfig::new(1.0)).unwrap();
//! assert!(out.violation.is_none(), "{:?}", out.violation);
//! ```
#![forbid(unsafe_code)]

pub mod litmus;
pub mod rng;
pub mod run;

pub use dmem_deploy::RecoveryTiming;
pub use dmem_sim::MessageFaults;
pub use litmus::Litmus;
pub use run::{
    CrashPoint, Failure, LitmusSummary, RunConfig, RunOutcome, Steer, SuiteConfig, SuiteReport,
    Violation, first_violation, run_one, run_suite,
};

/// Why the suite could not run (a violation is a result, not an error).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LitmusError {
    /// A litmus name that is not one of Fig. 5's tests.
    #[error("unknown litmus `{0}` (expected 1, 1-insert, 1-delete, 2, 3 or all)")]
    UnknownLitmus(String),
    /// A crash probability outside `[0, 1]`.
    #[error("crash probability {0} is outside [0, 1]")]
    CrashProb(f64),
    /// Zero seeds.
    #[error("the number of seeds must be at least 1")]
    NoSeeds,
    /// Another bad setting.
    #[error("bad litmus configuration: {0}")]
    Config(&'static str),
    /// The simulated cluster could not be built.
    #[error("simulator: {0}")]
    Sim(#[from] dmem_sim::SimError),
    /// The protocol could not be deployed or loaded.
    #[error("deploy: {0}")]
    Deploy(#[from] dmem_deploy::DeployError),
    /// A worker thread panicked.
    #[error("a litmus worker thread panicked")]
    WorkerPanicked,
}

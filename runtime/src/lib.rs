//! Real-time executors and the real-time clock of dmem (the `runtime/` layer).
//!
//! - [`Executor`]: a per-core polling executor. One thread runs many `!Send` tasks
//!   round-robin, calls registered completion-queue pollers between task polls, and serves
//!   timers. The same async protocol code runs on it and on the simulation executor, so
//!   nothing here knows about a particular fabric.
//! - [`RealClock`]: [`dmem_verbs::Clock`] on `CLOCK_MONOTONIC` ([`monotonic_now`]), shared by
//!   every process of a host; its sleeps are timers of the executor running on the current
//!   thread, and [`Clock::cpu`](dmem_verbs::Clock::cpu) is a no-op.
//!
//! - [`run_per_core`]: one executor per core, glommio's pinned `LocalExecutor` (feature
//!   `glommio`) or the polling executor, chosen by [`ExecutorKind::detect`]; jobs get a
//!   [`CoreClock`] and are written once.
#![forbid(unsafe_code)]

mod clock;
mod clocked;
mod executor;
mod per_core;
mod time;

pub use clock::{RealClock, Sleep};
pub use clocked::Clocked;
pub use executor::{Executor, RunOutcome, StopHandle, TaskId, YieldNow, spawn, yield_now};
pub use per_core::{CoreClock, ExecutorChoice, ExecutorKind, PerCoreError, run_per_core};
#[cfg(feature = "glommio")]
pub use per_core::{GlommioClock, IO_MEMORY, SPIN_BEFORE_PARK, glommio_probe, glommio_run};
pub use time::monotonic_now;

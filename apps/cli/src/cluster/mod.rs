//! Real deployments on the tcp fabric, or on the shm fabric within one host: `dmem mn`,
//! `dmem cn`, `dmem server` and `dmem cluster`, and `dmem bench --fabric tcp|shm`.
//!
//! A cluster is one TOML file ([`config`]): its nodes with their roles and addresses, the
//! heartbeat period and timeout, and the workload: the verbs-level `faa` (every post list
//! carries, for every MN, `batch` pairs of FAAs — one on the CN's own word, one on the MN's
//! shared word; a frame executes whole or not at all, so at every MN the shared word equals
//! the sum of the CN words even when a CN dies mid-run, and a CN that finished has exactly
//! `posts × batch` in its word), or a transaction workload (SmallBank, KVS, ...) on any
//! protocol of the registry that runs on real fabrics, where the first CN, not the MNs,
//! detects and recovers failed CNs.
//!
//! The modules, each depending only on those above it:
//! - [`control`]: the control messages the processes exchange, parsed and emitted;
//! - [`config`]: the cluster file's schema and validation;
//! - [`setup`]: the deployment every process derives from it;
//! - [`net`]: one process's side of the fabric (tcp or shm);
//! - [`history`]: a CN's history streamed on its stdout;
//! - [`report`]: the nodes' reports, the checks over them, the summaries;
//! - [`workload`]: a CN's coordinators (and `faa` clients) running the workload;
//! - [`mn`], [`cn`], [`server`]: the node processes;
//! - [`orchestrate`]: `dmem cluster` (foreground, or background up/status/down) and
//!   `dmem bench --fabric tcp|shm`.
//!
//! Real-time edges of the history checker compare `CLOCK_MONOTONIC` instants of different
//! processes: valid on one host (network namespaces included), not across machines.

mod cn;
mod config;
mod control;
mod history;
mod mn;
mod net;
mod orchestrate;
mod report;
mod server;
mod setup;
mod workload;

pub(crate) use cn::run_cn;
pub(crate) use config::NodeArgs;
pub(crate) use mn::run_mn;
pub(crate) use orchestrate::{ClusterArgs, bench_cluster, run_cluster};
pub(crate) use server::run_server;

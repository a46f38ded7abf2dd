//! The entry points of `dmem`'s transaction commands as a library, so that a test can run
//! them with a [`Registry`] of its own (a toy protocol goes through
//! exactly the code `dmem bench` runs). The `dmem` binary calls them with
//! `dmem_protocols::registry()`.

pub mod bench_txn;
pub mod common;
pub mod config;
pub mod litmus;

use clap::Parser;
use dmem_deploy::Registry;

#[derive(Parser, Debug)]
#[command(name = "dmem bench")]
struct BenchCli {
    #[command(flatten)]
    args: bench_txn::Args,
}

/// Runs `dmem bench ARGV...` (without the `dmem bench` words) on `registry`'s protocols.
///
/// # Errors
/// A bad flag or whatever [`bench_txn::run`] reports.
pub fn bench(argv: &[&str], registry: &Registry) -> anyhow::Result<Vec<bench_txn::Row>> {
    let cli = BenchCli::try_parse_from(std::iter::once("dmem-bench").chain(argv.iter().copied()))?;
    bench_txn::run(cli.args, registry)
}

#[derive(Parser, Debug)]
#[command(name = "dmem litmus")]
struct LitmusCli {
    #[command(flatten)]
    args: litmus::Args,
}

/// Runs `dmem litmus ARGV...` (without the `dmem litmus` words) on `registry`'s protocols.
///
/// # Errors
/// A bad flag or whatever [`litmus::run`] reports.
pub fn litmus(argv: &[&str], registry: &Registry) -> anyhow::Result<dmem_litmus::SuiteReport> {
    let cli =
        LitmusCli::try_parse_from(std::iter::once("dmem-litmus").chain(argv.iter().copied()))?;
    litmus::run(cli.args, registry)
}

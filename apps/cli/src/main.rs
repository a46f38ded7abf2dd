//! `dmem`: run verbs micro-benchmarks, lock and hashtable benchmarks, and transaction
//! workloads on the simulated cluster, shared memory, or real RDMA.

use clap::{Parser, Subcommand};

mod perf;

#[derive(Parser, Debug)]
#[command(name = "dmem", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// perftest-like load of one-sided verbs: throughput, latency, MN NIC busy fraction.
    Perf(perf::Args),
    /// Layer benchmarks (hashtable, locks) and transaction workloads.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Subcommand, Debug)]
enum BenchCommand {}

fn main() {
    let cli = Cli::parse();
    let result: anyhow::Result<()> = match cli.command {
        Command::Perf(args) => perf::run(args),
        Command::Bench(bench) => match bench {},
    };
    if let Err(err) = result {
        // One readable line: what went wrong and, through the error's context, what to do.
        eprintln!("dmem: error: {err:#}");
        std::process::exit(1);
    }
}

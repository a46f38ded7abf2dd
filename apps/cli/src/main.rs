//! `dmem`: run verbs micro-benchmarks, lock and hashtable benchmarks, and transaction
//! workloads on the simulated cluster, shared memory, or real RDMA.

use clap::{Parser, Subcommand};
use dmem_cli::{bench_txn, litmus};

mod bench_hashtable;
mod bench_locks;
mod perf;
mod recover;

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
    /// Transaction protocols side by side on a workload (`dmem bench --workload smallbank
    /// --protocol ford,pandora`), or a layer benchmark (`dmem bench hashtable`, `dmem bench
    /// locks`).
    Bench(BenchArgs),
    /// Pandora's litmus tests (§5, Fig. 5) with crash injection over many seeds (`dmem litmus
    /// --protocol ford --bug covert-locks --seeds 100 --crash-prob 0.5 [--json]`).
    Litmus(litmus::Args),
    /// A CN crash mid-run and its recovery: detection and recovery latency, transactions
    /// rolled forward / back, committed per ms around the crash (`dmem recover --protocol
    /// pandora|ford --workload smallbank --crash cn|half --crash-at-ms 10 [--json]`).
    Recover(recover::Args),
}

#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
struct BenchArgs {
    #[command(subcommand)]
    layer: Option<BenchCommand>,
    #[command(flatten)]
    txn: bench_txn::Args,
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// DLHT hashtable (batched and unbatched) vs hashbrown, std, dashmap, papaya, and the
    /// machine's random-load limit: Gets, Puts, 90/10 mixes on 8-byte keys and values.
    Hashtable(bench_hashtable::Args),
    /// DecLock's lock microbenchmark (§6.1) on the simulated cluster: CASLock, DSLR+,
    /// ShiftLock-style MCS and DecLock CQL under Zipfian contention.
    Locks(bench_locks::Args),
}

fn main() {
    let cli = Cli::parse();
    let result: anyhow::Result<()> = match cli.command {
        Command::Perf(args) => perf::run(args),
        Command::Litmus(args) => litmus::run(args, &dmem_protocols::registry()).map(drop),
        Command::Recover(args) => recover::run(args, &dmem_protocols::registry()),
        Command::Bench(BenchArgs { layer: None, txn }) => {
            bench_txn::run(txn, &dmem_protocols::registry()).map(drop)
        }
        Command::Bench(BenchArgs {
            layer: Some(bench), ..
        }) => match bench {
            BenchCommand::Hashtable(args) => bench_hashtable::run(args),
            BenchCommand::Locks(args) => bench_locks::run(args),
        },
    };
    if let Err(err) = result {
        // One readable line: what went wrong and, through the error's context, what to do.
        eprintln!("dmem: error: {err:#}");
        std::process::exit(1);
    }
}

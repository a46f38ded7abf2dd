//! `dmem`: run verbs micro-benchmarks, lock and hashtable benchmarks, and transaction
//! workloads on the simulated cluster, shared memory, or real RDMA.

use clap::{Parser, Subcommand};
use dmem_cli::common::{self, EXIT_ERROR, EXIT_OK};
use dmem_cli::{bench_txn, config, litmus};

mod bench_hashtable;
mod bench_locks;
mod cluster;
mod perf;
mod recover;
mod reproduce;

/// mimalloc instead of the system allocator: the simulator allocates and frees per READ
/// (its bytes) and per list of more than one work request, protocols per transaction, and
/// glibc's `malloc` + `free` took ≈170 instructions per simulated READ, mimalloc's ≈70
/// (dmem-sim README, "Real time"). It changes no simulated figure: allocation order and
/// addresses are no input to the model.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "dmem",
    version,
    about,
    propagate_version = true,
    after_help = "Exit codes: 0 ok; 1 error (one line on stderr, `dmem: error: ...`); 3 a check failed (history checker, invariants, litmus violations, a paper's ordering in `dmem reproduce`)."
)]
struct Cli {
    /// A whole run in one TOML file: the command's flags as keys (`duration_ms = 5`,
    /// `protocol = ["ford", "pandora"]`, `json = true`) and optionally `command = "bench
    /// locks"`; flags on the command line override the file's (see examples/runs/).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// perftest-like load of one-sided verbs: throughput, latency, MN NIC busy fraction.
    #[command(allow_negative_numbers = true)]
    Perf(perf::Args),
    /// Transaction protocols side by side on a workload (`dmem bench --workload smallbank
    /// --protocol ford,pandora`), or a layer benchmark (`dmem bench hashtable`, `dmem bench
    /// locks`).
    #[command(allow_negative_numbers = true)]
    Bench(Box<BenchArgs>),
    /// Pandora's litmus tests (§5, Fig. 5) with crash injection over many seeds (`dmem litmus
    /// --protocol ford --bug covert-locks --seeds 100 --crash-prob 0.5 [--json]`).
    #[command(allow_negative_numbers = true)]
    Litmus(litmus::Args),
    /// A CN crash mid-run and its recovery: detection and recovery latency, transactions
    /// rolled forward / back, committed per ms around the crash (`dmem recover --protocol
    /// pandora|ford --workload smallbank --crash cn|half --crash-at-ms 10 [--json]`).
    #[command(allow_negative_numbers = true)]
    Recover(recover::Args),
    /// A paper's key figures on the simulated cluster next to the paper's values: prints
    /// paper, dmem, ratio and whether each ordering holds; writes CSV and SVG under `--out`
    /// (default ./reproduce/PAPER/); exits 3 if an ordering does not hold.
    Reproduce(reproduce::Args),
    /// A memory-node process of a cluster file on the tcp fabric: serves its memory, detects
    /// failed CNs by heartbeats and revokes them, reports its memory at the end (`dmem mn
    /// --cluster cluster.toml --node mn0`).
    Mn(cluster::NodeArgs),
    /// A compute-node process of a cluster file: connects to every MN, heartbeats, runs the
    /// workload, reports (`dmem cn --cluster cluster.toml --node cn0`).
    Cn(cluster::NodeArgs),
    /// A server process of a symmetric protocol (Dandelion, FaSST) from a cluster file:
    /// holds its share of the records, serves the other servers, runs its coordinators,
    /// reports (`dmem server --cluster cluster.toml --node s0`).
    Server(cluster::NodeArgs),
    /// Starts every node of a cluster file as a separate process on this host (in its
    /// network namespace if it names one), optionally SIGKILLs a CN mid-run, collects the
    /// reports and checks them (`dmem cluster --cluster cluster.toml [--kill cn1]`).
    Cluster(cluster::ClusterArgs),
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
    /// machine's random-load limit: Gets, Puts and mixes (`--put-pct`) on 8-byte keys and values.
    #[command(allow_negative_numbers = true)]
    Hashtable(bench_hashtable::Args),
    /// DecLock's lock microbenchmark (§6.1) on the simulated cluster: CASLock, DSLR+,
    /// ShiftLock-style MCS and DecLock CQL under Zipfian contention.
    #[command(allow_negative_numbers = true)]
    Locks(bench_locks::Args),
}

fn main() {
    common::quiet_on_closed_stdout();
    std::panic::set_hook(Box::new(|info| {
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let at = info
            .location()
            .map_or(String::new(), |l| format!(" at {}:{}", l.file(), l.line()));
        eprintln!(
            "dmem: error: internal error (a bug in dmem, please report it): {}{at}",
            what.replace('\n', " ")
        );
    }));
    std::process::exit(run());
}

fn run() -> i32 {
    let argv = match config::expand(std::env::args_os().collect()) {
        Ok(argv) => argv,
        Err(err) => {
            eprintln!("dmem: error: {}", common::one_line(&err));
            return EXIT_ERROR;
        }
    };
    let cli = match Cli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(err) => {
            use clap::error::ErrorKind;
            return match err.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                    let _ = err.print();
                    EXIT_OK
                }
                ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
                | ErrorKind::MissingSubcommand => {
                    eprintln!(
                        "dmem: error: name a command: perf, bench, bench locks, bench hashtable, litmus, recover, reproduce, mn, cn, server or cluster (dmem --help)"
                    );
                    EXIT_ERROR
                }
                _ => {
                    eprintln!("dmem: error: {}", common::clap_error_line(&err));
                    EXIT_ERROR
                }
            };
        }
    };
    let result: anyhow::Result<()> = match cli.command {
        Command::Perf(args) => perf::run(args),
        Command::Litmus(args) => litmus::run(args, &dmem_protocols::registry()).map(drop),
        Command::Recover(args) => recover::run(args, &dmem_protocols::registry()),
        Command::Reproduce(args) => reproduce::run(args),
        Command::Mn(args) => cluster::run_mn(&args),
        Command::Cn(args) => cluster::run_cn(&args),
        Command::Server(args) => cluster::run_server(&args),
        Command::Cluster(args) => cluster::run_cluster(&args),
        Command::Bench(bench) => match *bench {
            // On tcp every protocol runs as processes: MNs and CNs, or a symmetric
            // protocol's servers.
            BenchArgs { layer: None, txn } if txn.fabric() == bench_txn::TxnFabric::Tcp => {
                cluster::bench_cluster(&txn)
            }
            BenchArgs { layer: None, txn } if txn.fabric() == bench_txn::TxnFabric::Rdma => {
                #[cfg(feature = "rdma")]
                {
                    // A host without a device gets its one line before any process starts.
                    dmem_rdma::device::RdmaDevice::open(None)
                        .map_err(anyhow::Error::from)
                        .and_then(|_| cluster::bench_cluster(&txn))
                }
                #[cfg(not(feature = "rdma"))]
                Err(anyhow::anyhow!(
                    "this dmem was built without RDMA support: build it with `cargo build --release -p dmem-cli --features rdma`"
                ))
            }
            BenchArgs { layer: None, txn } if txn.fabric() != bench_txn::TxnFabric::Sim => {
                match txn.symmetric_only(&dmem_protocols::registry()) {
                    Ok(true) => bench_txn::run_servers(txn, &dmem_protocols::registry()).map(drop),
                    Ok(false) => cluster::bench_cluster(&txn),
                    Err(e) => Err(e),
                }
            }
            BenchArgs { layer: None, txn } => {
                bench_txn::run(txn, &dmem_protocols::registry()).map(drop)
            }
            BenchArgs {
                layer: Some(bench), ..
            } => match bench {
                BenchCommand::Hashtable(args) => bench_hashtable::run(args),
                BenchCommand::Locks(args) => bench_locks::run(args),
            },
        },
    };
    match result {
        Ok(()) => EXIT_OK,
        Err(err) => {
            // One readable line: what went wrong and, through the error's context, what to do.
            eprintln!("dmem: error: {}", common::one_line(&err));
            common::exit_code(&err)
        }
    }
}

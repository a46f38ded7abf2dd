//! `dmem litmus`: Pandora's litmus tests (§5, Fig. 5) with crash injection against any
//! registered protocol (FORD fixed or with bug switches of Table 1, Pandora, …), over many
//! seeds.
//!
//! Prints a table (per litmus: runs, violations, first failing seed and reason) or, with
//! `--json`, one object with `runs`, `violations`, `first_failure` and `per_litmus`.
//! Exits non-zero on a bad flag; a violation is a result, printed, not an error.

use anyhow::{Context as _, bail};
use clap::Args as ClapArgs;
use dmem_deploy::{Protocol, Registry};
use dmem_litmus::{Litmus, RunConfig, SuiteConfig, SuiteReport, run_suite};

/// `dmem litmus` flags.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Protocol under test: any registered name (ford, pandora, pandora-lock-logging,
    /// ford:BUG[+BUG], …).
    #[arg(long)]
    protocol: String,
    /// FORD bugs to switch on (comma-separated: complicit-abort, missing-insert-log,
    /// covert-locks, relaxed-locks, lost-decision, log-without-lock, or all); the same as
    /// `--protocol ford:BUG+BUG`.
    #[arg(long)]
    bug: Option<String>,
    /// Litmus tests: comma-separated of 1, 1-insert, 1-delete, 2, 3, or all.
    #[arg(long, default_value = "all")]
    litmus: String,
    /// Seeds per litmus.
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    first_seed: u64,
    /// Probability that a run crashes a worker CN at a uniformly chosen work request.
    #[arg(long, default_value_t = 0.5)]
    crash_prob: f64,
    /// OS threads running seeds (results do not depend on it).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Print the checker's full explanation of each litmus's first failure.
    #[arg(long)]
    verbose: bool,
}

fn target(args: &Args, registry: &Registry) -> anyhow::Result<std::sync::Arc<dyn Protocol>> {
    let name = match &args.bug {
        Some(list) if args.protocol == "ford" => format!("ford:{}", list.replace(',', "+")),
        Some(_) => bail!(
            "--bug switches FORD's bugs; it does not apply to --protocol {}",
            args.protocol
        ),
        None => args.protocol.clone(),
    };
    registry.get(&name).context("--protocol")
}

/// Runs `dmem litmus` on `registry`'s protocols and returns the suite's report (a
/// violation is a result, printed, not an error).
///
/// # Errors
/// A bad flag, an unknown protocol (the error lists the registered ones), or a run that
/// could not be built.
pub fn run(args: Args, registry: &Registry) -> anyhow::Result<SuiteReport> {
    if args.seeds == 0 {
        bail!("--seeds must be at least 1");
    }
    if !(0.0..=1.0).contains(&args.crash_prob) {
        bail!("--crash-prob {} is outside [0, 1]", args.crash_prob);
    }
    let target = target(&args, registry)?;
    let litmus = Litmus::parse_list(&args.litmus).context("--litmus")?;
    let cfg = SuiteConfig {
        litmus,
        first_seed: args.first_seed,
        seeds: args.seeds,
        run: RunConfig::new(args.crash_prob),
        threads: args.threads.max(1),
    };
    let report = run_suite(&*target, &cfg)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report, &args);
    }
    if args.verbose {
        for s in &report.per_litmus {
            if let Some(f) = &s.first_failure {
                eprintln!(
                    "\nlitmus {} seed {} (crash {:?}):\n{}",
                    f.litmus, f.seed, f.crash, f.detail
                );
            }
        }
    }
    Ok(report)
}

fn print_table(report: &SuiteReport, args: &Args) {
    println!(
        "dmem litmus: {} | seeds {}..{} | crash-prob {} | {:.2} s",
        report.protocol,
        args.first_seed,
        args.first_seed + args.seeds,
        args.crash_prob,
        report.wall_s
    );
    println!(
        "{:<9} {:<29} {:>6} {:>7} {:>9} {:>10} {:>10}  first failure",
        "litmus", "checks", "runs", "crashed", "recovered", "committed", "violations"
    );
    for s in &report.per_litmus {
        let first = s.first_failure.as_ref().map_or_else(
            || "-".to_owned(),
            |f| format!("seed {}: {}", f.seed, f.reason),
        );
        println!(
            "{:<9} {:<29} {:>6} {:>7} {:>9} {:>10} {:>10}  {}",
            s.litmus, s.title, s.runs, s.crashes, s.recovered, s.committed, s.violations, first
        );
    }
    println!(
        "total: {} runs, {} violations{}",
        report.runs,
        report.violations,
        report
            .first_failure
            .as_ref()
            .map_or_else(String::new, |f| format!(
                "; first: litmus {} seed {}",
                f.litmus, f.seed
            ))
    );
}

//! `dmem litmus`: Pandora's litmus tests (§5, Fig. 5) with crash injection against any
//! registered protocol (FORD fixed or with bug switches of Table 1, Pandora, …), over many
//! seeds.
//!
//! Prints a table (per litmus: runs, violations, first failing seed and reason) or, with
//! `--json`, JSON lines: one object per litmus, then a summary object with `runs`,
//! `violations`, `first_failure` and the configuration. Exits 1 on a bad flag and 3 when a
//! violation was found (the table or JSON is printed first).

use anyhow::{Context as _, bail, ensure};
use clap::Args as ClapArgs;
use dmem_deploy::{Protocol, Registry};
use dmem_litmus::{Litmus, RunConfig, SuiteConfig, SuiteReport, run_suite};
use serde::Serialize;

use crate::common::{self, CheckFailed, Sink};

/// `dmem litmus` flags.
#[derive(ClapArgs, Debug, Clone, Serialize)]
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
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    seeds: u64,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    first_seed: u64,
    /// Probability that a run crashes a worker CN (1: every run, the suite's default
    /// setting; a crash placed after the racy part still lets crash-free bugs show).
    #[arg(long, default_value_t = 1.0)]
    crash_prob: f64,
    /// Share of the crashes aimed at a protocol phase (a phase name, then an occurrence,
    /// or an aborted attempt that had logged); the others fall on a uniformly chosen work
    /// request (0: uniform placement only).
    #[arg(long, default_value_t = RunConfig::new(0.0).targeted)]
    targeted: f64,
    /// Share of the litmus instances whose schedule is steered (commits aligned in time,
    /// or per-role waits before each commit); 0: the seeded shapes alone.
    #[arg(long, default_value_t = RunConfig::new(0.0).steer)]
    steer: f64,
    /// Probability that a two-sided message (lock RPC, heartbeat, notification) is
    /// delayed by `--msg-delay-ns`.
    #[arg(long, default_value_t = RunConfig::new(0.0).message_faults.delay)]
    msg_delay: f64,
    /// Extra delay of a delayed message, ns.
    #[arg(long, default_value_t = RunConfig::new(0.0).message_faults.delay_ns)]
    msg_delay_ns: u64,
    /// Probability that a message is lost (a protocol that claims to tolerate loss,
    /// LOTUS, loses at least 0.5 % anyway; the others claim nothing).
    #[arg(long, default_value_t = 0.0)]
    msg_loss: f64,
    /// Probability that a message is delivered twice (no protocol here claims to
    /// tolerate it).
    #[arg(long, default_value_t = 0.0)]
    msg_dup: f64,
    /// OS threads running seeds (results do not depend on it).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: u16,
    /// Print JSON lines instead of the table: one object per litmus, then a summary.
    #[arg(long)]
    json: bool,
    /// Also write the per-litmus rows to this CSV file.
    #[arg(long, value_name = "FILE")]
    csv: Option<std::path::PathBuf>,
    /// Print the checker's full explanation of each litmus's first failure.
    #[arg(long)]
    verbose: bool,
}

fn target(args: &Args, registry: &Registry) -> anyhow::Result<std::sync::Arc<dyn Protocol>> {
    ensure!(
        !args.protocol.is_empty(),
        "--protocol needs a protocol name"
    );
    if let Some(list) = &args.bug {
        let bugs: Vec<&str> = list.split(',').map(str::trim).collect();
        ensure!(
            bugs.iter().all(|b| !b.is_empty()),
            "--bug needs bug names, comma-separated (complicit-abort, missing-insert-log, covert-locks, relaxed-locks, lost-decision, log-without-lock, all)"
        );
        common::no_duplicates("bug", &bugs)?;
    }
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
    if !(0.0..=1.0).contains(&args.crash_prob) {
        bail!("--crash-prob {} is outside [0, 1]", args.crash_prob);
    }
    ensure!(
        (0.0..=1.0).contains(&args.targeted),
        "--targeted {} is outside [0, 1]",
        args.targeted
    );
    ensure!(
        (0.0..=1.0).contains(&args.steer),
        "--steer {} is outside [0, 1]",
        args.steer
    );
    let mut run_cfg = RunConfig::new(args.crash_prob);
    run_cfg.targeted = args.targeted;
    run_cfg.steer = args.steer;
    run_cfg.message_faults = common::message_faults(
        args.msg_loss,
        args.msg_dup,
        args.msg_delay,
        args.msg_delay_ns,
    )?;
    let target = target(&args, registry)?;
    let names: Vec<&str> = args.litmus.split(',').map(str::trim).collect();
    ensure!(
        names.iter().all(|n| !n.is_empty()),
        "--litmus needs names, comma-separated (1, 1-insert, 1-delete, 2, 3, all)"
    );
    common::no_duplicates("litmus", &names)?;
    let litmus = Litmus::parse_list(&args.litmus).context("--litmus")?;
    let mut sink = Sink::new(args.json, args.csv.as_deref())?;
    // Seeds run in chunks so that the progress bar moves; the report is the same as one
    // suite over all seeds (every run is independent and the first failure is the first
    // by seed).
    let bar = common::progress(args.seeds, "dmem litmus", "seeds", args.json);
    let chunk = (args.seeds / 50).max(1);
    let mut report: Option<SuiteReport> = None;
    let mut done = 0;
    while done < args.seeds {
        let n = chunk.min(args.seeds - done);
        let cfg = SuiteConfig {
            litmus: litmus.clone(),
            first_seed: args.first_seed.saturating_add(done),
            seeds: n,
            run: run_cfg.clone(),
            threads: usize::from(args.threads),
        };
        let part = run_suite(&*target, &cfg)?;
        report = Some(match report {
            None => part,
            Some(acc) => merge(acc, part),
        });
        done += n;
        bar.set_position(done);
    }
    bar.finish_and_clear();
    let report = report.context("no seed ran")?;
    for s in &report.per_litmus {
        sink.row(s)?;
    }
    if !args.json {
        print_table(&report, &args);
    }
    sink.finish(
        "litmus",
        &args,
        serde_json::json!({
            "protocol": report.protocol,
            "runs": report.runs,
            "violations": report.violations,
            "first_failure": report.first_failure,
            "wall_s": common::round(report.wall_s, 2),
        }),
    )?;
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
    if report.violations > 0 {
        return Err(CheckFailed(format!(
            "{} of {} litmus runs of {} found a violation",
            report.violations, report.runs, report.protocol
        ))
        .into());
    }
    for s in &report.per_litmus {
        common::committed_something(
            &format!(
                "litmus {} of {} over {} runs",
                s.litmus, report.protocol, s.runs
            ),
            s.committed,
            "raise --seeds or lower --crash-prob",
        )?;
    }
    Ok(report)
}

/// Two reports over consecutive seed ranges as one.
fn merge(mut a: SuiteReport, b: SuiteReport) -> SuiteReport {
    a.runs += b.runs;
    a.violations += b.violations;
    a.wall_s += b.wall_s;
    if a.first_failure.is_none() {
        a.first_failure = b.first_failure;
    }
    for (x, y) in a.per_litmus.iter_mut().zip(b.per_litmus) {
        x.runs += y.runs;
        x.violations += y.violations;
        x.crashes += y.crashes;
        x.recovered += y.recovered;
        x.committed += y.committed;
        if x.first_failure.is_none() {
            x.first_failure = y.first_failure;
        }
    }
    a
}

fn print_table(report: &SuiteReport, args: &Args) {
    println!(
        "dmem litmus: {} | seeds {}..{} | crash-prob {} | targeted {} | steer {} | {:.2} s",
        report.protocol,
        args.first_seed,
        args.first_seed + args.seeds,
        args.crash_prob,
        args.targeted,
        args.steer,
        report.wall_s
    );
    let mut t = common::table(&[
        "litmus",
        "checks",
        "runs",
        "crashed",
        "recovered",
        "committed",
        "violations",
        "first failure",
    ]);
    if let Some(c) = t.column_mut(1) {
        c.set_cell_alignment(comfy_table::CellAlignment::Left);
    }
    if let Some(c) = t.column_mut(7) {
        c.set_cell_alignment(comfy_table::CellAlignment::Left);
    }
    for s in &report.per_litmus {
        let first = s.first_failure.as_ref().map_or_else(
            || "-".to_owned(),
            |f| format!("seed {}: {}", f.seed, f.reason),
        );
        t.add_row(vec![
            s.litmus.to_string(),
            s.title.to_string(),
            s.runs.to_string(),
            s.crashes.to_string(),
            s.recovered.to_string(),
            s.committed.to_string(),
            s.violations.to_string(),
            first,
        ]);
    }
    println!("{}", common::render(&t));
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

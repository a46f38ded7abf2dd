//! For each FORD bug switch alone: the first seed at which the suite shows a violation;
//! for fixed FORD and Pandora: violations over a seed range.
//!
//! `cargo run --release -p dmem-litmus --example seeds_to_find -- [max_seeds] [crash_prob]`

use std::time::Instant;

use dmem_ford::{BugSet, FordBug, ProtocolConfig};
use dmem_litmus::{FordTarget, Litmus, RunConfig, SuiteConfig, first_violation, run_suite};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let max: u64 = args.next().map_or(Ok(2000), |s| s.parse())?;
    let p: f64 = args.next().map_or(Ok(0.5), |s| s.parse())?;
    let cfg = RunConfig::new(p);
    for bug in FordBug::ALL {
        let t = FordTarget::new(ProtocolConfig::ford_with(BugSet::NONE.with(bug)));
        let start = Instant::now();
        let found = first_violation(&t, &Litmus::ALL, 0, max, &cfg)?;
        match found {
            Some(o) => println!(
                "{bug:<20} seed {:>5} litmus {:<8} {:.2}s  {}",
                o.seed,
                o.litmus.name(),
                start.elapsed().as_secs_f64(),
                o.violation.map(|v| v.reason).unwrap_or_default()
            ),
            None => println!("{bug:<20} not found in {max} seeds"),
        }
    }
    for (name, c) in [
        ("ford", ProtocolConfig::ford_fixed()),
        ("pandora", ProtocolConfig::pandora()),
    ] {
        let r = run_suite(
            &FordTarget::new(c),
            &SuiteConfig {
                litmus: Litmus::ALL.to_vec(),
                first_seed: 0,
                seeds: max.min(200),
                run: cfg.clone(),
                threads: 2,
            },
        )?;
        println!(
            "{name}: runs {} violations {} first {:?} ({:.2}s)",
            r.runs, r.violations, r.first_failure, r.wall_s
        );
    }
    Ok(())
}

//! For each FORD bug switch alone: the first seed at which its litmus tests (Pandora Table 1)
//! show a violation;
//! for fixed FORD and Pandora: violations over a seed range. Protocols come from the
//! registry by name.
//!
//! `cargo run --release -p dmem-litmus --example seeds_to_find -- [max_seeds] [crash_prob] [targeted] [steer]`

use std::time::Instant;

use dmem_litmus::{Litmus, RunConfig, SuiteConfig, first_violation, run_suite};

const BUGS: [&str; 6] = [
    "complicit-abort",
    "missing-insert-log",
    "covert-locks",
    "relaxed-locks",
    "lost-decision",
    "log-without-lock",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let max: u64 = args.next().map_or(Ok(2000), |s| s.parse())?;
    let p: f64 = args.next().map_or(Ok(0.5), |s| s.parse())?;
    let mut cfg = RunConfig::new(p);
    if let Some(t) = args.next() {
        cfg.targeted = t.parse()?;
    }
    if let Some(s) = args.next() {
        cfg.steer = s.parse()?;
    }
    println!(
        "crash_prob {p} targeted {} steer {}",
        cfg.targeted, cfg.steer
    );
    let registry = dmem_protocols::registry();
    for bug in BUGS {
        let t = registry.get(&format!("ford:{bug}"))?;
        let start = Instant::now();
        // Each bug by the litmus tests Pandora Table 1 finds it with (as the tests do).
        let litmus: &[Litmus] = match bug {
            "complicit-abort" => &[
                Litmus::DirectWrite,
                Litmus::DirectWriteInsert,
                Litmus::DirectWriteDelete,
            ],
            "missing-insert-log" => &[Litmus::DirectWriteInsert, Litmus::DirectWriteDelete],
            "covert-locks" | "relaxed-locks" => &[Litmus::ReadWrite],
            _ => &[Litmus::IndirectWrite],
        };
        let found = first_violation(&*t, litmus, 0, max, &cfg)?;
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
    for name in ["ford", "pandora"] {
        let r = run_suite(
            &*registry.get(name)?,
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

//! Per FORD bug switch: the share of seeds whose runs show a violation (any litmus), and the
//! power of an N-seed "fixed protocol passes" test against that bug, 1 − (1 − rate)^N.
//!
//! `cargo run --release -p dmem-litmus --example detection_rates -- [seeds] [crash_prob] [targeted] [power_seeds] [steer]`

use dmem_litmus::{Litmus, RunConfig, run_one};

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
    let seeds: u64 = args.next().map_or(Ok(200), |s| s.parse())?;
    let p: f64 = args.next().map_or(Ok(0.5), |s| s.parse())?;
    let mut cfg = RunConfig::new(p);
    if let Some(t) = args.next() {
        cfg.targeted = t.parse()?;
    }
    let n: i32 = args.next().map_or(Ok(50), |s| s.parse())?;
    if let Some(s) = args.next() {
        cfg.steer = s.parse()?;
    }
    println!(
        "crash_prob {p} targeted {} steer {} seeds {seeds}: detecting seeds, power of a {n}-seed test",
        cfg.targeted, cfg.steer
    );
    let registry = dmem_protocols::registry();
    for bug in BUGS {
        let t = registry.get(&format!("ford:{bug}"))?;
        let mut hits = 0u64;
        for seed in 0..seeds {
            let mut found = false;
            for l in Litmus::ALL {
                if run_one(&*t, l, seed, &cfg)?.violation.is_some() {
                    found = true;
                    break;
                }
            }
            hits += u64::from(found);
        }
        let rate = hits as f64 / seeds as f64;
        println!(
            "{bug:<20} {hits:>4}/{seeds} seeds ({:>5.1} %)  power {:>5.1} %",
            rate * 100.0,
            (1.0 - (1.0 - rate).powi(n)) * 100.0
        );
    }
    Ok(())
}

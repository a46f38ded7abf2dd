//! DecLock (lock microbenchmark, §6.1, Figs. 12–13) on the simulated cluster: CASLock,
//! DSLR+, ShiftLock, DecLock-TF and DecLock-PF, 8 CNs × 16 cores, one MN, `cx4` (the paper's
//! ConnectX-4), 100k Zipf(0.99) locks, 50 % reads unless a sweep varies it.
//!
//! Sweeps: clients 8–256; critical-section length 0–20 µs; read ratio 0–100 %; number of
//! locks 1k–1M; each reports throughput, MN operations and retries per acquisition.

use anyhow::Context as _;

use super::{Claim, Figure, Outcome, Paper, num};
use crate::bench_locks;

pub(crate) const PAPER: Paper = Paper {
    name: "declock",
    title: "DecLock, lock microbenchmark, Figs. 12-13",
    run,
    steps: 5 + 4 + 4 + 4,
};

const LOCKS: [&str; 5] = ["caslock", "dslr", "shiftlock", "declock-tf", "declock-pf"];
/// Measured virtual ms per point (after a 10 % warm-up).
const DURATION_MS: &str = "5";

/// One point: every lock under the same flags; rows in [`LOCKS`] order.
fn point(extra: &[&str]) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut argv = vec![
        "--lock",
        "caslock,dslr,shiftlock,declock-tf,declock-pf",
        "--cns",
        "8",
        "--threads",
        "16",
        "--profile",
        "cx4",
        "--duration-ms",
        DURATION_MS,
    ];
    argv.extend_from_slice(extra);
    let rows = bench_locks::measure(&argv).with_context(|| format!("dmem bench locks {argv:?}"))?;
    anyhow::ensure!(rows.len() == LOCKS.len(), "one row per lock");
    Ok(rows)
}

/// A sweep: for each x, one point; returns per-lock series of `field`s.
struct Sweep {
    x: Vec<f64>,
    rows: Vec<Vec<serde_json::Value>>,
}

impl Sweep {
    fn series(&self, field: &str, locks: &[&str]) -> anyhow::Result<Vec<(String, Vec<f64>)>> {
        locks
            .iter()
            .map(|l| {
                let i = LOCKS.iter().position(|x| x == l).context("known lock")?;
                let ys = self
                    .rows
                    .iter()
                    .map(|r| num(&r[i], field))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                Ok(((*l).to_string(), ys))
            })
            .collect()
    }

    fn at(&self, point: usize, lock: &str, field: &str) -> anyhow::Result<f64> {
        let i = LOCKS
            .iter()
            .position(|x| *x == lock)
            .context("known lock")?;
        num(&self.rows[point][i], field)
    }

    fn ratio(&self, point: usize, a: &str, b: &str) -> anyhow::Result<f64> {
        Ok(self.at(point, a, "mops")? / self.at(point, b, "mops")?.max(1e-12))
    }
}

fn sweep(
    bar: &indicatif::ProgressBar,
    xs: &[f64],
    flags: impl Fn(f64) -> Vec<String>,
) -> anyhow::Result<Sweep> {
    let mut rows = Vec::new();
    for &x in xs {
        let f = flags(x);
        let argv: Vec<&str> = f.iter().map(String::as_str).collect();
        rows.push(point(&argv)?);
        bar.inc(1);
    }
    Ok(Sweep {
        x: xs.to_vec(),
        rows,
    })
}

fn fig(
    id: &'static str,
    title: &str,
    x_label: &'static str,
    y_label: &'static str,
    log_x: bool,
    s: &Sweep,
    field: &str,
) -> anyhow::Result<Figure> {
    Ok(Figure {
        id,
        title: title.to_string(),
        x_label,
        y_label,
        log_x,
        x: s.x.clone(),
        series: s.series(field, &LOCKS)?,
    })
}

fn run(bar: &indicatif::ProgressBar) -> anyhow::Result<Outcome> {
    let mut out = Outcome::default();
    // Fig. 12: clients 8..256 (8 CNs × 1..32).
    let clients = sweep(bar, &[8.0, 32.0, 64.0, 128.0, 256.0], |c| {
        vec!["--clients".into(), format!("{}", c as u64 / 8)]
    })?;
    out.figures.push(fig(
        "fig12_clients_mops",
        "Fig. 12: throughput vs clients (8 CNs, 100k locks, zipf 0.99, 50% reads)",
        "clients",
        "Mops",
        false,
        &clients,
        "mops",
    )?);
    out.figures.push(fig(
        "fig12_clients_mn_ops",
        "Fig. 12: MN ops per acquisition vs clients",
        "clients",
        "MN ops / acquisition",
        false,
        &clients,
        "mn_ops_per_acquire",
    )?);
    let last = clients.x.len() - 1;
    for (a, b, paper) in [
        ("declock-tf", "caslock", 43.0),
        ("declock-tf", "dslr", 4.35),
        ("declock-tf", "shiftlock", 1.81),
        ("declock-pf", "shiftlock", 1.40),
    ] {
        let r = clients.ratio(last, a, b)?;
        out.claims.push(Claim::new(
            "fig12",
            format!("{a} / {b} Mops at 256 clients (paper: up to)"),
            paper,
            r,
            format!("{a} > {b}"),
            r > 1.0,
        ));
    }
    let tf_ops = clients.at(last, "declock-tf", "mn_ops_per_acquire")?;
    let cas_ops = clients.at(last, "caslock", "mn_ops_per_acquire")?;
    out.claims.push(Claim::new(
        "fig12",
        "declock-tf MN ops per acquisition at 256 clients",
        1.1,
        tf_ops,
        "declock-tf < caslock MN ops per acquisition",
        tf_ops < cas_ops,
    ));

    // Fig. 13: critical-section length at 256 clients.
    let cs = sweep(bar, &[0.0, 1.0, 5.0, 20.0], |us| {
        vec![
            "--clients".into(),
            "32".into(),
            "--cs-ns".into(),
            format!("{}", (us * 1000.0) as u64),
        ]
    })?;
    out.figures.push(fig(
        "fig13_cs_mops",
        "Fig. 13: throughput vs critical section (256 clients)",
        "critical section, us",
        "Mops",
        false,
        &cs,
        "mops",
    )?);
    out.figures.push(fig(
        "fig13_cs_retries",
        "Fig. 13: retries per acquisition vs critical section (256 clients)",
        "critical section, us",
        "retries / acquisition (mean)",
        false,
        &cs,
        "retries_per_acquire",
    )?);
    out.figures.push(fig(
        "fig13_cs_retries_max",
        "Fig. 13: most retries of one acquisition vs critical section (256 clients)",
        "critical section, us",
        "retries, max of one acquisition",
        false,
        &cs,
        "retries_max",
    )?);
    out.figures.push(fig(
        "fig13_cs_atomics",
        "MN atomics served vs critical section (cx4 same-address limit 2.5 Mops)",
        "critical section, us",
        "MN CAS + FAA, Mops",
        false,
        &cs,
        "mn_atomic_mops",
    )?);
    let lead_0 = cs.ratio(0, "declock-tf", "caslock")?;
    let lead_20 = cs.ratio(cs.x.len() - 1, "declock-tf", "caslock")?;
    out.claims.push(Claim::new(
        "fig13",
        "declock-tf / caslock Mops at 20 us critical sections (paper: up to)",
        43.0,
        lead_20,
        "declock-tf > caslock with long critical sections",
        lead_20 > 1.0,
    ));
    out.claims.push(Claim::new(
        "fig13",
        "declock-tf / caslock lead, 20 us over 0 us",
        f64::NAN,
        lead_20 / lead_0,
        "lead grows with the critical section (see locks/README.md)",
        lead_20 >= lead_0,
    ));
    let retries_20 = cs.at(cs.x.len() - 1, "caslock", "retries_max")?;
    let retries_0 = cs.at(0, "caslock", "retries_max")?;
    out.claims.push(Claim::new(
        "fig13",
        "caslock most retries of one acquisition at 20 us",
        388.0,
        retries_20,
        "caslock retries grow with the critical section",
        retries_20 > retries_0,
    ));

    // Read ratio at 256 clients.
    let reads = sweep(bar, &[0.0, 0.5, 0.95, 1.0], |r| {
        vec![
            "--clients".into(),
            "32".into(),
            "--read-ratio".into(),
            r.to_string(),
        ]
    })?;
    out.figures.push(fig(
        "fig13_read_ratio_mops",
        "Throughput vs read ratio (256 clients)",
        "read ratio",
        "Mops",
        false,
        &reads,
        "mops",
    )?);
    let worst = (0..reads.x.len())
        .map(|i| reads.ratio(i, "declock-tf", "caslock"))
        .collect::<anyhow::Result<Vec<_>>>()?
        .into_iter()
        .fold(f64::MAX, f64::min);
    out.claims.push(Claim::new(
        "fig13",
        "min declock-tf / caslock Mops over read ratios",
        f64::NAN,
        worst,
        "declock-tf >= caslock at every read ratio",
        worst >= 1.0,
    ));

    // Number of locks at 256 clients.
    let locks = sweep(bar, &[1e3, 1e4, 1e5, 1e6], |n| {
        vec![
            "--clients".into(),
            "32".into(),
            "--locks".into(),
            format!("{}", n as u64),
        ]
    })?;
    out.figures.push(fig(
        "fig13_locks_mops",
        "Throughput vs number of locks (256 clients)",
        "locks",
        "Mops",
        true,
        &locks,
        "mops",
    )?);
    let worst = (0..locks.x.len())
        .map(|i| locks.ratio(i, "declock-tf", "caslock"))
        .collect::<anyhow::Result<Vec<_>>>()?
        .into_iter()
        .fold(f64::MAX, f64::min);
    out.claims.push(Claim::new(
        "fig13",
        "min declock-tf / caslock Mops over lock counts",
        f64::NAN,
        worst,
        "declock-tf >= caslock at every lock count",
        worst >= 1.0,
    ));
    Ok(out)
}

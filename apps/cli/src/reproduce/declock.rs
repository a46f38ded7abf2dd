//! DecLock (lock microbenchmark, §6.1, Figs. 12–13) on the simulated cluster: CASLock,
//! DSLR+, ShiftLock, DecLock-TF and DecLock-PF, 8 CNs × 16 cores, one MN, `cx4` (the paper's
//! ConnectX-4), 100k Zipf(0.99) locks, 50 % reads unless a sweep varies it.
//!
//! Sweeps: clients 8–256; critical-section length 0–20 µs; read ratio 0–100 %; number of
//! locks 1k–1M; each reports throughput, MN operations and retries per acquisition.

use anyhow::Context as _;

use super::{Claim, Figure, Outcome, Paper, Rule, num};
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

/// `[a, b]`: a ahead of b (throughput), or a above b (a lead, retries).
const AHEAD: Rule = Rule::Greater;
/// `[declock-tf, caslock]` MN operations per acquisition: fewer.
const FEWER: Rule = Rule::Less;
/// DecLock-TF / CASLock at every point of a sweep: at least 1.
const NEVER_BEHIND: Rule = Rule::AllAtLeast(1.0);

/// Why CASLock trails by less than the paper's 43× (measured, `docs/results/locks.md`,
/// "Why DecLock's lead over CASLock shrinks").
const CASLOCK_GAP: &str = "model: CASLock's CASes on a hot word are served at the same-address rate (cx4 2.5 Mops), so its retries cannot flood the NIC as the paper's did; the paper's 43x is its most, at long critical sections";
const HOT_LOCK_BOUND: &str = "model: with zipf 0.99 DecLock meets the hot-lock bound (1 / (p0 x hold time)) at 20 us while CASLock stays at its same-address limit, so the lead shrinks (docs/results/locks.md)";

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
        let claim = Claim::checked(
            "fig12",
            format!("{a} / {b} Mops at 256 clients (paper: up to)"),
            paper,
            r,
            format!("{a} > {b}"),
            AHEAD,
            vec![clients.at(last, a, "mops")?, clients.at(last, b, "mops")?],
        );
        out.claims.push(if b == "caslock" {
            claim.miss(CASLOCK_GAP)
        } else {
            claim
        });
    }
    let tf_ops = clients.at(last, "declock-tf", "mn_ops_per_acquire")?;
    let cas_ops = clients.at(last, "caslock", "mn_ops_per_acquire")?;
    out.claims.push(Claim::checked(
        "fig12",
        format!("declock-tf MN ops per acquisition at 256 clients (caslock {cas_ops:.2})"),
        1.1,
        tf_ops,
        "declock-tf < caslock MN ops per acquisition",
        FEWER,
        vec![tf_ops, cas_ops],
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
    let at_20 = cs.x.len() - 1;
    out.claims.push(
        Claim::checked(
            "fig13",
            "declock-tf / caslock Mops at 20 us critical sections (paper: up to)",
            43.0,
            lead_20,
            "declock-tf > caslock with long critical sections",
            AHEAD,
            vec![
                cs.at(at_20, "declock-tf", "mops")?,
                cs.at(at_20, "caslock", "mops")?,
            ],
        )
        .miss(HOT_LOCK_BOUND),
    );
    out.claims.push(Claim::checked(
        "fig13",
        "declock-tf / caslock lead, 20 us over 0 us",
        f64::NAN,
        lead_20 / lead_0,
        "lead grows with the critical section (see docs/results/locks.md)",
        AHEAD,
        vec![lead_20, lead_0],
    ));
    let retries_20 = cs.at(at_20, "caslock", "retries_max")?;
    let retries_0 = cs.at(0, "caslock", "retries_max")?;
    out.claims.push(
        Claim::checked(
            "fig13",
            format!("caslock most retries of one acquisition at 20 us (0 us: {retries_0:.0})"),
            388.0,
            retries_20,
            "caslock retries grow with the critical section",
            AHEAD,
            vec![retries_20, retries_0],
        )
        .miss("model: each retry waits its turn at the hot word's same-address rate (cx4 2.5 Mops); 388 in a 20 us critical section needs failed CASes answered at ~15 Mops (docs/results/locks.md)"),
    );

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
    let leads = (0..reads.x.len())
        .map(|i| reads.ratio(i, "declock-tf", "caslock"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    out.claims.push(Claim::checked(
        "fig13",
        "min declock-tf / caslock Mops over read ratios",
        f64::NAN,
        leads.iter().copied().fold(f64::MAX, f64::min),
        "declock-tf >= caslock at every read ratio",
        NEVER_BEHIND,
        leads,
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
    let leads = (0..locks.x.len())
        .map(|i| locks.ratio(i, "declock-tf", "caslock"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    out.claims.push(Claim::checked(
        "fig13",
        "min declock-tf / caslock Mops over lock counts",
        f64::NAN,
        leads.iter().copied().fold(f64::MAX, f64::min),
        "declock-tf >= caslock at every lock count",
        NEVER_BEHIND,
        leads,
    ));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rule a DecLock claim is judged by, with numbers that fail it and numbers that
    /// pass it.
    #[test]
    fn every_claim_can_fail_and_can_pass() {
        let table: [(&str, Rule, Vec<f64>, Vec<f64>); 3] = [
            // declock-tf vs caslock/dslr/shiftlock Mops; a lead 20 us vs 0 us; retries.
            ("ahead", AHEAD, vec![0.50, 0.52], vec![3.5, 0.52]),
            ("fewer MN ops", FEWER, vec![4.7, 4.7], vec![1.1, 4.7]),
            (
                "never behind",
                NEVER_BEHIND,
                vec![6.8, 0.97, 6.8, 6.7],
                vec![6.8, 1.0, 6.8, 6.7],
            ),
        ];
        for (name, rule, fail, pass) in table {
            assert!(!rule.holds(&fail), "{name} holds for {fail:?}");
            assert!(rule.holds(&pass), "{name} fails for {pass:?}");
        }
        // The two Fig. 13 trends fail on the numbers measured (docs/results/locks.md).
        assert!(!AHEAD.holds(&[2.02, 6.75]));
        assert!(!AHEAD.holds(&[113.0, 113.0]));
    }
}

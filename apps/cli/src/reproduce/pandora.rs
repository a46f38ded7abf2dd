//! Pandora (steady state §6.2, recovery §6.1 / Table 2, FORD's Baseline scan) on the
//! simulated cluster, `cx5`, 3 MNs, as `dmem bench` and `dmem recover` run it.

use anyhow::Context as _;

use super::{Claim, Figure, Outcome, Paper, num};
use crate::recover;

pub(crate) const PAPER: Paper = Paper {
    name: "pandora",
    title: "Pandora: PILL steady state, recovery latency, FORD's stop-the-world scan",
    run,
    steps: 3 + 4 + 3,
};

const PROTOCOLS: [&str; 3] = ["ford", "pandora", "pandora-lock-logging"];

fn run(bar: &indicatif::ProgressBar) -> anyhow::Result<Outcome> {
    let registry = dmem_protocols::registry();
    let mut out = Outcome::default();

    // Steady state: FORD, Pandora, lock logging on SmallBank and TATP.
    let mut steady: Vec<Vec<f64>> = vec![Vec::new(); PROTOCOLS.len()];
    for (workload, scale) in [("smallbank", "small"), ("tatp", "tiny"), ("tpcc", "tiny")] {
        let rows = dmem_cli::bench_txn::measure(
            &[
                "--workload",
                workload,
                "--scale",
                scale,
                "--protocol",
                "ford,pandora,pandora-lock-logging",
                "--duration-ms",
                "5",
            ],
            &registry,
        )
        .with_context(|| format!("dmem bench --workload {workload}"))?;
        for (i, row) in rows.iter().enumerate() {
            anyhow::ensure!(
                row["checker"] == "ok" && row["invariants"] == "ok",
                "{workload}: a correctness check failed: {row}"
            );
            steady[i].push(num(row, "mtps")?);
        }
        bar.inc(1);
    }
    out.figures.push(Figure {
        id: "steady_state_mtps",
        title: "Steady state (x: 1 = SmallBank small, 2 = TATP tiny, 3 = TPC-C tiny)".into(),
        x_label: "workload",
        y_label: "Mtps",
        log_x: false,
        x: vec![1.0, 2.0, 3.0],
        series: PROTOCOLS
            .iter()
            .map(|p| (*p).to_string())
            .zip(steady.iter().cloned())
            .collect(),
    });
    let (ford, pandora, logging) = (&steady[0], &steady[1], &steady[2]);
    out.claims.push(Claim::new(
        "§6.2",
        "pandora / ford Mtps, SmallBank",
        0.912 / 0.919,
        pandora[0] / ford[0],
        "pandora within 5% of ford",
        (pandora[0] / ford[0] - 1.0).abs() <= 0.05,
    ));
    out.claims.push(Claim::new(
        "§6.2",
        "lock logging / ford Mtps, SmallBank",
        0.65,
        logging[0] / ford[0],
        "lock logging < pandora",
        logging[0] < pandora[0],
    ));
    out.claims.push(Claim::new(
        "§6.2",
        "lock logging / ford Mtps, TATP",
        0.98,
        logging[1] / ford[1],
        "lock logging <= pandora",
        logging[1] <= pandora[1],
    ));
    out.claims.push(Claim::new(
        "§6.2",
        "pandora / ford Mtps, TPC-C",
        1.0,
        pandora[2] / ford[2],
        "pandora within 5% of ford",
        (pandora[2] / ford[2] - 1.0).abs() <= 0.05,
    ));
    out.claims.push(Claim::new(
        "§6.2",
        "lock logging / ford Mtps, TPC-C",
        0.86,
        logging[2] / ford[2],
        "lock logging < pandora",
        logging[2] < pandora[2],
    ));

    // Recovery latency vs outstanding transactions of the crashed CN.
    let shapes = [(1u32, 1u32), (1, 8), (8, 8), (8, 64)];
    let paper_us = [8.0, f64::NAN, 232.0, 5272.0];
    let mut latency = Vec::new();
    for (t, c) in shapes {
        let (t, c) = (t.to_string(), c.to_string());
        let r = recover::measure(
            &[
                "--protocol",
                "pandora",
                "--workload",
                "smallbank",
                "--scale",
                "small",
                "--threads",
                &t,
                "--coroutines",
                &c,
                "--crash-at-ms",
                "4",
                "--duration-ms",
                "16",
                "--json",
            ],
            &registry,
        )
        .context("dmem recover --protocol pandora")?;
        anyhow::ensure!(
            r["checker"] == "ok" && r["invariants"] == "ok",
            "recovery failed a check: {r}"
        );
        latency.push(num(&r, "recovery_latency_us")?);
        bar.inc(1);
    }
    let outstanding: Vec<f64> = shapes.iter().map(|&(t, c)| f64::from(t * c)).collect();
    out.figures.push(Figure {
        id: "recovery_latency",
        title: "Pandora recovery latency vs outstanding transactions of the crashed CN".into(),
        x_label: "outstanding transactions",
        y_label: "recovery latency, us",
        log_x: true,
        x: outstanding.clone(),
        series: vec![
            ("pandora (dmem)".into(), latency.clone()),
            ("pandora (paper, Table 2)".into(), paper_us.to_vec()),
        ],
    });
    for (i, &p) in paper_us.iter().enumerate() {
        if p.is_finite() {
            out.claims.push(Claim::new(
                "Table 2",
                format!("pandora recovery us, {} outstanding", outstanding[i]),
                p,
                latency[i],
                "recovery grows with outstanding transactions",
                latency.windows(2).all(|w| w[1] >= w[0]),
            ));
        }
    }

    // FORD's stop-the-world scan vs data size.
    let mut records = Vec::new();
    let mut scan_ms = Vec::new();
    for (workload, scale) in [
        ("smallbank", "tiny"),
        ("tatp", "tiny"),
        ("smallbank", "small"),
    ] {
        let r = recover::measure(
            &[
                "--protocol",
                "ford",
                "--workload",
                workload,
                "--scale",
                scale,
                "--cns",
                "2",
                "--threads",
                "4",
                "--coroutines",
                "8",
                "--crash-at-ms",
                "2",
                "--duration-ms",
                "8",
                "--json",
            ],
            &registry,
        )
        .with_context(|| format!("dmem recover --protocol ford --workload {workload}"))?;
        records.push(num(&r, "records")?);
        scan_ms.push(num(&r, "recovery_latency_us")? / 1e3);
        bar.inc(1);
    }
    let mut order: Vec<usize> = (0..records.len()).collect();
    order.sort_by(|&a, &b| records[a].total_cmp(&records[b]));
    let records: Vec<f64> = order.iter().map(|&i| records[i]).collect();
    let scan_ms: Vec<f64> = order.iter().map(|&i| scan_ms[i]).collect();
    out.figures.push(Figure {
        id: "ford_scan",
        title: "FORD's recovery (stop-the-world lock scan) vs data size".into(),
        x_label: "records",
        y_label: "recovery latency, ms",
        log_x: true,
        x: records.clone(),
        series: vec![("ford scan (dmem)".into(), scan_ms.clone())],
    });
    let last = records.len() - 1;
    out.claims.push(Claim::new(
        "§6.1",
        "ford scan, s per 1M records (largest store)",
        5.0,
        scan_ms[last] / 1e3 / (records[last] / 1e6),
        "ford's scan grows with the data size",
        scan_ms.windows(2).all(|w| w[1] >= w[0]),
    ));
    out.claims.push(Claim::new(
        "§6.1",
        "ford recovery / pandora recovery (200k records, 64 outstanding)",
        f64::NAN,
        scan_ms[last] * 1e3 / latency[2],
        "pandora recovers faster than ford's scan",
        scan_ms[last] * 1e3 > latency[2],
    ));
    Ok(out)
}

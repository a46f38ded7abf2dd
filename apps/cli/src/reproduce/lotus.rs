//! LOTUS on the simulated cluster with LOTUS's testbed (`cx3`, 3 MNs, 3-way replication,
//! 9 CNs), as `dmem bench` runs it: §2.2 Fig. 2/3 (Motor and FORD against the MNs' NIC
//! atomics, and what removing the lock CAS would gain) and §8.3 Fig. 13 on SmallBank (LOTUS
//! against Motor and FORD, maximum throughput over the concurrency sweep, MN atomics per
//! transaction). Motor keeps 3 versions per record on SmallBank (LOTUS §8's setting for
//! Motor); `motor:no-cas` is unsafe on purpose.

use anyhow::Context as _;

use super::{Claim, Figure, Outcome, Paper, num};

pub(crate) const PAPER: Paper = Paper {
    name: "lotus",
    title: "LOTUS: MN atomics bound Motor and FORD (Figs. 2-3); LOTUS vs Motor and FORD (Fig. 13)",
    run,
    steps: COROUTINES.len() as u64,
};

/// Coroutines per thread; concurrent transactions = 9 CNs × 4 threads × this (LOTUS §8.1:
/// 9 CNs, 9–540 concurrent transactions).
const COROUTINES: [u32; 5] = [1, 2, 4, 8, 16];

fn run(bar: &indicatif::ProgressBar) -> anyhow::Result<Outcome> {
    let registry = dmem_protocols::registry();
    let protocols = ["ford", "motor", "motor:no-cas", "lotus"];
    let mut lotus_atomics: f64 = 0.0;
    let mut series: Vec<Vec<f64>> = vec![Vec::new(); protocols.len()];
    for co in COROUTINES {
        let co = co.to_string();
        let list = protocols.join(",");
        let argv = [
            "--workload",
            "smallbank",
            "--scale",
            "small",
            "--profile",
            "cx3",
            "--mns",
            "3",
            "--cns",
            "9",
            "--threads",
            "4",
            "--coroutines",
            &co,
            "--duration-ms",
            "3",
            "--protocol",
            &list,
        ];
        let rows = dmem_cli::bench_txn::measure(&argv, &registry)
            .with_context(|| format!("dmem bench {}", argv.join(" ")))?;
        for (i, row) in rows.iter().enumerate() {
            if protocols[i] != "motor:no-cas" {
                anyhow::ensure!(
                    row["checker"] == "ok" && row["invariants"] == "ok",
                    "{}: a correctness check failed: {row}",
                    protocols[i]
                );
            }
            series[i].push(num(row, "mtps")?);
            if protocols[i] == "lotus" {
                lotus_atomics =
                    lotus_atomics.max(num(row, "mn_cas_per_txn")? + num(row, "mn_faa_per_txn")?);
            }
        }
        bar.inc(1);
    }
    let concurrent: Vec<f64> = COROUTINES.iter().map(|&c| f64::from(c * 36)).collect();
    let peak = |s: &[f64]| s.iter().copied().fold(f64::MIN, f64::max);
    let (ford, motor, no_cas, lotus) = (&series[0], &series[1], &series[2], &series[3]);
    let last = COROUTINES.len() - 1;
    let mut out = Outcome::default();
    out.claims.push(Claim::new(
        "Fig. 2",
        "motor Mtps at 576 / at its peak",
        f64::NAN,
        motor[last] / peak(motor),
        "motor stops scaling once the MNs saturate",
        motor[last] / peak(motor) < 1.0,
    ));
    out.claims.push(Claim::new(
        "Fig. 2",
        "motor / ford peak Mtps",
        f64::NAN,
        peak(motor) / peak(ford),
        "motor ahead of ford",
        peak(motor) > peak(ford),
    ));
    out.claims.push(Claim::new(
        "Fig. 3",
        "motor without the CAS / motor, peak Mtps",
        2.4,
        peak(no_cas) / peak(motor),
        "removing the lock CAS raises motor's peak",
        peak(no_cas) > peak(motor),
    ));
    out.claims.push(Claim::new(
        "Fig. 13",
        "lotus / motor max Mtps, SmallBank",
        2.1,
        peak(lotus) / peak(motor),
        "lotus ahead of motor",
        peak(lotus) > peak(motor),
    ));
    out.claims.push(Claim::new(
        "Fig. 13",
        "lotus / ford max Mtps, SmallBank",
        3.3,
        peak(lotus) / peak(ford),
        "lotus ahead of ford",
        peak(lotus) > peak(ford),
    ));
    out.claims.push(Claim::new(
        "§4.1",
        "lotus MN atomics per transaction (most over the sweep)",
        0.0,
        lotus_atomics,
        "locks never reach the MNs",
        lotus_atomics == 0.0,
    ));
    out.figures.push(Figure {
        id: "fig2_fig3_concurrency",
        title: "SmallBank, cx3, 3 MNs: throughput vs concurrent transactions".into(),
        x_label: "concurrent transactions",
        y_label: "Mtps",
        log_x: true,
        x: concurrent,
        series: protocols
            .iter()
            .map(|p| (*p).to_string())
            .zip(series.iter().cloned())
            .collect(),
    });
    Ok(out)
}

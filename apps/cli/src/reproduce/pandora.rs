//! Pandora (steady state §6.2, recovery §6.1 / Table 2, fail-over throughput of Figs. 9–11,
//! FORD's Baseline scan) on the simulated cluster, `cx5`, 3 MNs, as `dmem bench` and `dmem
//! recover` run it.

use anyhow::Context as _;

use super::{Claim, Figure, Outcome, Paper, Rule, num, per_ms};
use crate::recover;

pub(crate) const PAPER: Paper = Paper {
    name: "pandora",
    title: "Pandora: PILL steady state, recovery latency, fail-over, FORD's stop-the-world scan",
    run,
    steps: 3 + 4 + FAILOVER.len() as u64 + 3,
};

const PROTOCOLS: [&str; 3] = ["ford", "pandora", "pandora-lock-logging"];

/// Fail-over runs (Figs. 9–11): figure, workload, scale, figure file. TATP and TPC-C at
/// `tiny`, as the steady state runs them; at `tiny` FORD's scan of TATP ends inside the
/// window.
const FAILOVER: [(&str, &str, &str, &str); 3] = [
    ("Fig. 9", "smallbank", "small", "failover_smallbank"),
    ("Fig. 10", "tatp", "tiny", "failover_tatp"),
    ("Fig. 11", "tpcc", "tiny", "failover_tpcc"),
];
/// `[lock logging, pandora]` Mtps: lock logging behind.
const BEHIND: Rule = Rule::Less;
/// `[a, b]`: a above b (recovery latency with more outstanding transactions, FORD's scan
/// over Pandora's recovery).
const ABOVE: Rule = Rule::Greater;
/// A series that grows at every step (recovery latency, FORD's scan over data sizes).
const GROWS: Rule = Rule::Increasing;
/// Pandora's committed per ms after the crash: every ms commits.
const KEEPS_COMMITTING: Rule = Rule::AllAbove(0.0);
/// `[after restart, before crash]` committed per ms: back to at least 90 %.
const BACK: Rule = Rule::RatioAtLeast(0.9);
/// FORD's committed per ms after the crash: some ms commits nothing.
const STOPS: Rule = Rule::MinAtMost(0.0);

/// Why the steady-state "within 5 % of FORD" is not judged.
const SAME_VERBS: &str = "by construction: in steady state pandora posts ford's verbs (PILL changes what a lock word holds and recovery, not the data path)";

/// The fail-over runs' crash instant and length, ms of virtual time.
const FAILOVER_CRASH_MS: usize = 4;
const FAILOVER_MS: usize = 16;

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
    out.claims.push(Claim::by_construction(
        "§6.2",
        "pandora / ford Mtps, SmallBank",
        0.912 / 0.919,
        pandora[0] / ford[0],
        "pandora within 5% of ford",
        SAME_VERBS,
    ));
    for (i, what, paper) in [
        (0, "SmallBank", 0.65),
        (1, "TATP", 0.98),
        (2, "TPC-C", 0.86),
    ] {
        out.claims.push(Claim::checked(
            "§6.2",
            format!(
                "lock logging / ford Mtps, {what} (pandora / ford {:.3})",
                pandora[i] / ford[i]
            ),
            paper,
            logging[i] / ford[i],
            "lock logging < pandora",
            BEHIND,
            vec![logging[i], pandora[i]],
        ));
    }
    out.claims.push(Claim::by_construction(
        "§6.2",
        "pandora / ford Mtps, TPC-C",
        1.0,
        pandora[2] / ford[2],
        "pandora within 5% of ford",
        SAME_VERBS,
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
    // Table 2: one row per shape the paper gives; the growth is judged once per step (1 →
    // 8 → 64 on the 64 row, 64 → 512 on the 512 row), the first row is the magnitude alone.
    out.claims.push(Claim::info(
        "Table 2",
        "pandora recovery us, 1 outstanding",
        paper_us[0],
        latency[0],
        "recovery grows with outstanding transactions",
        "magnitude only: the growth is judged on the next rows",
    ));
    out.claims.push(
        Claim::checked(
            "Table 2",
            format!(
                "pandora recovery us, 64 outstanding (1: {:.1}, 8: {:.1})",
                latency[0], latency[1]
            ),
            paper_us[2],
            latency[2],
            "recovery grows with outstanding transactions (1 -> 8 -> 64)",
            GROWS,
            latency[..3].to_vec(),
        )
        .miss(super::NOT_EXPLAINED),
    );
    out.claims.push(Claim::checked(
        "Table 2",
        "pandora recovery us, 512 outstanding",
        paper_us[3],
        latency[3],
        "recovery grows with outstanding transactions (64 -> 512)",
        ABOVE,
        vec![latency[3], latency[2]],
    ));

    // Figs. 9–11: committed per ms around a CN crash, one of three coordinator CNs (§6.1:
    // Pandora's throughput "does not drop to zero, but drops to about two-thirds"; the
    // Baseline, FORD's recovery, stops every CN while it scans the locks).
    for (figure, workload, scale, id) in FAILOVER {
        // Per protocol: committed per ms, and the mean per ms before the crash and after
        // recovery finished.
        let mut runs: Vec<(Vec<f64>, f64, f64)> = Vec::new();
        for (protocol, restart) in [
            ("pandora", None),
            ("ford", None),
            ("pandora", Some(RESTART_AFTER_US)),
        ] {
            runs.push(failover_run(&registry, protocol, workload, scale, restart)?);
        }
        let [
            (pandora, before, after),
            (ford, ..),
            (restarted, restarted_before, _),
        ] = [runs.remove(0), runs.remove(0), runs.remove(0)];
        out.claims.extend(failover_claims(
            figure,
            workload,
            &pandora,
            (before, after),
            &ford,
        ));
        out.claims.push(restart_claim(
            figure,
            workload,
            &restarted,
            restarted_before,
        ));
        out.figures.push(Figure {
            id,
            title: format!(
                "{workload} ({scale}): committed per ms, one of 3 CNs crashes at {FAILOVER_CRASH_MS} ms"
            ),
            x_label: "ms of virtual time",
            y_label: "committed per ms",
            log_x: false,
            x: (0..FAILOVER_MS).map(|ms| ms as f64).collect(),
            series: vec![
                ("pandora".into(), pandora),
                ("ford".into(), ford),
                ("pandora, crashed CN restarted".into(), restarted),
            ],
        });
        bar.inc(1);
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
    out.claims.push(
        Claim::checked(
            "§6.1",
            "ford scan, s per 1M records (largest store)",
            5.0,
            scan_ms[last] / 1e3 / (records[last] / 1e6),
            "ford's scan grows with the data size",
            GROWS,
            scan_ms.clone(),
        )
        .miss("not yet explained (dmem's scan reads 56 B per record: scan_bytes 11.2 MB for 200k SmallBank records)"),
    );
    out.claims.push(Claim::checked(
        "§6.1",
        "ford recovery / pandora recovery (200k records, 64 outstanding)",
        f64::NAN,
        scan_ms[last] * 1e3 / latency[2],
        "pandora recovers faster than ford's scan",
        ABOVE,
        vec![scan_ms[last] * 1e3, latency[2]],
    ));
    Ok(out)
}

/// One fail-over run of `protocol` (Figs. 9–11): committed per ms, and the mean per ms
/// before the crash and after recovery finished; with `restart_after_us`, the crashed CN
/// comes back that long after its failure was detected.
fn failover_run(
    registry: &dmem_deploy::Registry,
    protocol: &str,
    workload: &str,
    scale: &str,
    restart_after_us: Option<u64>,
) -> anyhow::Result<(Vec<f64>, f64, f64)> {
    let (crash_at, duration) = (FAILOVER_CRASH_MS.to_string(), FAILOVER_MS.to_string());
    let mut args = vec![
        "--protocol",
        protocol,
        "--workload",
        workload,
        "--scale",
        scale,
        "--cns",
        "3",
        "--crash-at-ms",
        &crash_at,
        "--duration-ms",
        &duration,
        "--json",
    ];
    let restart = restart_after_us.map(|us| us.to_string());
    if let Some(us) = &restart {
        args.extend(["--restart-after-us", us]);
    }
    let r = recover::measure(&args, registry)
        .with_context(|| format!("dmem recover {}", args.join(" ")))?;
    anyhow::ensure!(
        r["checker"] == "ok" && r["invariants"] == "ok",
        "{protocol} fail-over on {workload} failed a check: {r}"
    );
    let committed = per_ms(&r)?;
    anyhow::ensure!(
        committed.len() == FAILOVER_MS,
        "dmem recover's series has {} ms, not {FAILOVER_MS}",
        committed.len()
    );
    Ok((
        committed,
        num(&r, "before_per_ms")?,
        num(&r, "after_per_ms")?,
    ))
}

/// When a crashed CN comes back in the restart runs, µs after its failure was detected:
/// with the 5 ms detection timeout it is back about 6 ms after the fault (Pandora §6.3: "the
/// failed coordinators are brought back in less than 10ms after the fault").
const RESTART_AFTER_US: u64 = 1_000;

/// The last ms of a fail-over window: the restarted CN's coordinators have run for a few
/// ms by then.
const RESTARTED_TAIL_MS: usize = 4;

/// Fig. 8's second line, in Figs. 9–11's runs: with the crashed CN restarted, Pandora's
/// throughput is back where it was before the crash ("the post-recovery throughput matches
/// the pre-failure throughput"), judged over the window's last [`RESTARTED_TAIL_MS`] ms.
fn restart_claim(figure: &'static str, workload: &str, restarted: &[f64], before: f64) -> Claim {
    let tail = &restarted[restarted.len().saturating_sub(RESTARTED_TAIL_MS)..];
    let tail_mean = tail.iter().sum::<f64>() / tail.len().max(1) as f64;
    Claim::checked(
        figure,
        format!(
            "{workload}: pandora with the crashed CN restarted, committed per ms at the end / before the crash"
        ),
        1.0,
        if before > 0.0 {
            tail_mean / before
        } else {
            0.0
        },
        "throughput back where it was (at least 90 %)",
        BACK,
        vec![tail_mean, before],
    )
}

/// The claims of a fail-over figure (Figs. 9–11) from committed per ms around the crash at
/// [`FAILOVER_CRASH_MS`]: Pandora keeps committing and settles at about two-thirds of its
/// rate before (one of three CNs lost); FORD's recovery stops every CN while it scans.
/// `(before, after)`: Pandora's mean per ms before the crash and after recovery finished.
fn failover_claims(
    figure: &'static str,
    workload: &str,
    pandora: &[f64],
    (before, after): (f64, f64),
    ford: &[f64],
) -> [Claim; 2] {
    let ford_after = ford[FAILOVER_CRASH_MS..].to_vec();
    let ford_low = ford_after.iter().copied().fold(f64::INFINITY, f64::min);
    let pandora_claim = Claim::checked(
        figure,
        format!(
            "{workload}: pandora committed per ms after recovery / before (1 of 3 CNs crashed)"
        ),
        2.0 / 3.0,
        after / before,
        "pandora commits in every ms after the crash",
        KEEPS_COMMITTING,
        pandora[FAILOVER_CRASH_MS..].to_vec(),
    );
    [
        if workload == "tpcc" {
            pandora_claim.miss("not yet explained; measured: TPC-C tiny (2 warehouses) commits about 45 per ms before the crash and 40 after, a ratio of small counts")
        } else {
            pandora_claim
        },
        Claim::checked(
            figure,
            format!("{workload}: ford's lowest committed per ms after the crash"),
            0.0,
            ford_low,
            "ford stops every CN while it scans",
            STOPS,
            ford_after,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failover_claims_hold_only_for_a_pandora_that_keeps_committing_and_a_ford_that_stops() {
        let before = vec![30.0; FAILOVER_CRASH_MS];
        let mut pandora = before.clone();
        pandora.extend([15.0, 18.0, 20.0, 20.0]);
        let mut ford = before.clone();
        ford.extend([15.0, 0.0, 0.0, 10.0]);
        let [p, f] = failover_claims("Fig. 9", "smallbank", &pandora, (30.0, 20.0), &ford);
        assert_eq!((p.holds, f.holds), (Some(true), Some(true)));
        assert!((p.dmem - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(f.dmem, 0.0);
        // A Pandora that stops for a millisecond, a FORD that never does: neither holds.
        pandora[FAILOVER_CRASH_MS + 1] = 0.0;
        ford[FAILOVER_CRASH_MS + 1] = 5.0;
        ford[FAILOVER_CRASH_MS + 2] = 5.0;
        let [p, f] = failover_claims("Fig. 9", "smallbank", &pandora, (30.0, 20.0), &ford);
        assert_eq!((p.holds, f.holds), (Some(false), Some(false)));
        assert_eq!(f.dmem, 5.0);
        // Before the crash nothing counts: a quiet warm-up is not a stop.
        pandora[FAILOVER_CRASH_MS + 1] = 20.0;
        pandora[0] = 0.0;
        let [p, _] = failover_claims("Fig. 9", "smallbank", &pandora, (30.0, 20.0), &ford);
        assert_eq!(p.holds, Some(true));
    }

    /// Every rule a Pandora claim is judged by, with numbers that fail it and numbers that
    /// pass it.
    #[test]
    fn the_restart_claim_judges_the_windows_tail_against_before() {
        // Back over the last ms, though the restart dipped earlier.
        let back = [20.0, 20.0, 5.0, 10.0, 19.0, 20.0, 19.0, 20.0];
        let c = restart_claim("Fig. 9", "smallbank", &back, 20.0);
        assert_eq!(c.holds, Some(true), "{c:?}");
        // One CN of three still missing at the end.
        let lost = [20.0, 20.0, 5.0, 13.0, 13.0, 14.0, 13.0, 13.0];
        assert_eq!(
            restart_claim("Fig. 9", "smallbank", &lost, 20.0).holds,
            Some(false)
        );
    }

    #[test]
    fn every_claim_can_fail_and_can_pass() {
        let table: [(&str, Rule, Vec<f64>, Vec<f64>); 6] = [
            (
                "lock logging behind",
                BEHIND,
                vec![3.0, 3.0],
                vec![2.3, 3.0],
            ),
            (
                "recovery above",
                ABOVE,
                vec![600.0, 607.0],
                vec![4866.0, 607.0],
            ),
            (
                "grows",
                GROWS,
                vec![10.0, 60.0, 60.0],
                vec![10.0, 60.0, 607.0],
            ),
            (
                "keeps committing",
                KEEPS_COMMITTING,
                vec![15.0, 0.0, 20.0],
                vec![15.0, 1.0, 20.0],
            ),
            ("stops", STOPS, vec![15.0, 5.0, 10.0], vec![15.0, 0.0, 10.0]),
            ("back", BACK, vec![1700.0, 2000.0], vec![1850.0, 2000.0]),
        ];
        for (name, rule, fail, pass) in table {
            assert!(!rule.holds(&fail), "{name} holds for {fail:?}");
            assert!(rule.holds(&pass), "{name} fails for {pass:?}");
        }
    }
}

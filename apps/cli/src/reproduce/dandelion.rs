//! Dandelion (SmallBank and TATP against FaSST §7, the O(G,P) micro-benchmarks of Figs.
//! 8–13, the ablation of Fig. 16/17, servers 3 → 10 of Fig. 18–21 with Tables 5/6's
//! batching degree, and the load sweep of Fig. 22)
//! on the simulated cluster: `cx5`, R = 3, 4 threads per server, as `dmem bench --servers N`
//! runs it. Why the figures differ from the paper's is in `protocol/dandelion/README.md`.

use anyhow::Context as _;

use super::{Claim, Figure, Outcome, Paper, Rule, num};

pub(crate) const PAPER: Paper = Paper {
    name: "dandelion",
    title: "Dandelion: batched RPCs against FaSST, micro-benchmarks, ablation, scaling, load",
    run,
    steps: 2 + MICRO.len() as u64 + 2 + SERVERS.len() as u64 + CONTEXTS.len() as u64,
};

/// The O(G,P) micro-benchmarks (§8.1, Figs. 8–13): `--mix` and the paper's name. The paper
/// gives them as figures only; its text says the three DNL protocols are the same on the
/// read-only ones (all run Dnl-RO) and differ only on O(4,2).
const MICRO: [(&str, &str); 4] = [
    ("o1-0", "O(1,0)"),
    ("o0-1", "O(0,1)"),
    ("o4-0", "O(4,0)"),
    ("o4-2", "O(4,2)"),
];

const SERVERS: [u16; 4] = [3, 5, 7, 10];

/// `[a, b]`: a ahead of b (Dnl-4 over FaSST, a ladder step over the previous one).
const AHEAD: Rule = Rule::Greater;
/// `[fastest, slowest]` of Dnl-4/-2/-1 on O(4,2): they differ by more than 5 %.
const DIFFER: Rule = Rule::RatioAbove(1.05);
/// Dnl-4 / FaSST at every server count: above 1.
const AHEAD_AT_EVERY_SIZE: Rule = Rule::AllAbove(1.0);
/// Messages per packet over server counts: never rises.
const DEGREE_FALLS: Rule = Rule::NonIncreasing;
/// Dnl-4 Mtps over contexts 8, 16, …, 128 (each a doubling): the first doubling gains
/// more than 20 % and the last (64 → 128) less than 10 %. Fig. 22's knee is at ≈ 75
/// contexts per thread (`docs/results/dandelion.md`), so the curve should still climb at
/// 8 → 16 and be flat past 64; the per-point values of the paper's figure are not in dmem's
/// notes, so the 20 % and 10 % are this reading of the figure's shape, not its numbers.
const FLATTENS: Rule = Rule::Flattens {
    first: 0.20,
    last: 0.10,
};

/// Why Dnl-4's lead over FaSST (and network batching's gain) is below the paper's:
/// measured in `docs/results/dandelion.md`, "Why the figures differ".
const LOW_DEGREE_SMALLBANK: &str = "scale/setup: 4.8 msgs per packet at 5 servers vs the paper's 15.5 (4 sim threads x 64 contexts per server vs 64 threads x ~100; aborts reach 30 % at 64 contexts and cap the load)";
const LOW_DEGREE_TATP: &str = "setup: 2.6 msgs per packet vs the paper's 10.3; 70 % of TATP's txns are one-key GetOnes, local 60 % of the time at 5 servers and R = 3, so few messages remain to batch";
const CONTEXTS: [u32; 5] = [8, 16, 32, 64, 128];

/// `dmem bench` rows of `protocols` on `workload` (a YCSB `--mix` after a `:`, e.g.
/// `ycsb:o4-2`) with `servers` servers and `contexts` coroutines per thread, 2 ms; `check`:
/// the history checker too (invariants always).
fn rows(
    workload: &str,
    protocols: &[&str],
    servers: u16,
    contexts: u32,
    check: bool,
) -> anyhow::Result<Vec<serde_json::Value>> {
    let (workload, mix) = match workload.split_once(':') {
        Some((w, mix)) => (w, Some(mix)),
        None => (workload, None),
    };
    let (list, servers, contexts) = (
        protocols.join(","),
        servers.to_string(),
        contexts.to_string(),
    );
    let mut argv = vec![
        "--workload",
        workload,
        "--scale",
        "small",
        "--servers",
        &servers,
        "--coroutines",
        &contexts,
        "--duration-ms",
        "2",
        "--protocol",
        &list,
    ];
    if !check {
        argv.push("--no-check");
    }
    if let Some(mix) = mix {
        argv.extend(["--mix", mix]);
    }
    let rows = dmem_cli::bench_txn::measure(&argv, &dmem_protocols::registry())
        .with_context(|| format!("dmem bench {}", argv.join(" ")))?;
    for row in &rows {
        anyhow::ensure!(
            (row["checker"] == "ok" || !check) && row["invariants"] == "ok",
            "a correctness check failed: {row}"
        );
    }
    Ok(rows)
}

fn mtps(rows: &[serde_json::Value]) -> anyhow::Result<Vec<f64>> {
    rows.iter().map(|r| num(r, "mtps")).collect()
}

fn run(bar: &indicatif::ProgressBar) -> anyhow::Result<Outcome> {
    let mut out = Outcome::default();

    // §7: Dnl-4 against FaSST, 5 servers, 64 contexts per thread.
    for (workload, paper) in [("smallbank", 102.0 / 23.0), ("tatp", 268.0 / 51.0)] {
        let m = mtps(&rows(workload, &["fasst", "dnl-4"], 5, 64, true)?)?;
        out.claims.push(
            Claim::checked(
                "§7",
                format!("{workload}: dnl-4 / fasst Mtps (5 servers)"),
                paper,
                m[1] / m[0],
                "dnl-4 ahead of fasst",
                AHEAD,
                vec![m[1], m[0]],
            )
            .miss(if workload == "tatp" {
                LOW_DEGREE_TATP
            } else {
                LOW_DEGREE_SMALLBANK
            }),
        );
        bar.inc(1);
    }

    // §8.1 Figs. 8–13: O(G,P), 5 servers, 64 contexts per thread.
    for (mix, name) in MICRO {
        let m = mtps(&rows(
            &format!("ycsb:{mix}"),
            &["fasst", "dnl-4", "dnl-2", "dnl-1"],
            5,
            64,
            true,
        )?)?;
        out.claims.push(Claim::checked(
            "Figs. 8-13",
            format!("{name}: dnl-4 / fasst Mtps"),
            f64::NAN,
            m[1] / m[0],
            "dnl-4 ahead of fasst",
            AHEAD,
            vec![m[1], m[0]],
        ));
        let (lo, hi) = m[1..]
            .iter()
            .fold((f64::INFINITY, 0.0_f64), |(lo, hi), &x| {
                (lo.min(x), hi.max(x))
            });
        let what = format!("{name}: fastest / slowest of dnl-4, dnl-2, dnl-1 Mtps");
        if mix.ends_with("-0") {
            out.claims.push(Claim::by_construction(
                "§8.1",
                what,
                1.0,
                hi / lo,
                "the DNL protocols are one (Dnl-RO) on read-only mixes",
                "by construction: dnl-4, dnl-2 and dnl-1 run the same Dnl-RO code on a read-only transaction",
            ));
        } else if mix == "o4-2" {
            out.claims.push(Claim::checked(
                "§8.1",
                what,
                f64::NAN,
                hi / lo,
                "the DNL protocols differ on O(4,2)",
                DIFFER,
                vec![hi, lo],
            ));
        }
        bar.inc(1);
    }

    // Fig. 16/17: the ablation ladder.
    let ladder = [
        ("+ network batching", "dnl:4+no-ht-batch+no-local-reads"),
        ("+ hashtable batching", "dnl:4+no-local-reads"),
        ("+ local reads", "dnl-4"),
    ];
    let mut protocols = vec!["fasst"];
    protocols.extend(ladder.map(|(_, p)| p));
    for (workload, paper) in [
        ("smallbank", [4.0, 1.25, 1.07]),
        ("tatp", [3.0, 1.20, 1.07]),
    ] {
        let m = mtps(&rows(workload, &protocols, 5, 64, false)?)?;
        for (i, (step, _)) in ladder.iter().enumerate() {
            out.claims.push(
                Claim::checked(
                    "Fig. 16/17",
                    format!("{workload}: {step} / previous step Mtps"),
                    paper[i],
                    m[i + 1] / m[i],
                    format!("{step} gains"),
                    AHEAD,
                    vec![m[i + 1], m[i]],
                )
                .miss(if workload == "tatp" {
                    LOW_DEGREE_TATP
                } else {
                    LOW_DEGREE_SMALLBANK
                }),
            );
        }
        bar.inc(1);
    }

    // Fig. 18–21, Tables 5/6: servers 3 → 10 on SmallBank.
    let mut ratio = Vec::new();
    let mut degree = Vec::new();
    for n in SERVERS {
        let r = rows("smallbank", &["fasst", "dnl-4"], n, 64, false)?;
        let m = mtps(&r)?;
        ratio.push(m[1] / m[0]);
        degree.push(num(&r[1], "msgs_per_packet")?);
        bar.inc(1);
    }
    let last = SERVERS.len() - 1;
    out.claims.push(
        Claim::checked(
            "Fig. 18",
            "smallbank: dnl-4 / fasst Mtps at 10 servers",
            3.0,
            ratio[last],
            "dnl-4 ahead of fasst at every size",
            AHEAD_AT_EVERY_SIZE,
            ratio.clone(),
        )
        .miss(LOW_DEGREE_SMALLBANK),
    );
    out.claims.push(
        Claim::checked(
            "Table 6",
            "smallbank: dnl-4 msgs per packet, 3 servers / most (paper 9, here 10)",
            25.0 / 8.9,
            degree[0] / degree[last],
            "batching degree falls as servers grow",
            DEGREE_FALLS,
            degree.clone(),
        )
        .miss("scale: the load per server is lower (4 sim threads x 64 contexts vs 64 threads x ~100), so the degree is lower at every size (11.6 vs 25 at 3 servers, 2.6 vs 8.9 at 9); why it falls by more (4.8x vs 2.8x) is not yet explained"),
    );
    out.figures.push(Figure {
        id: "fig18_servers",
        title: "SmallBank, 64 contexts per thread: Dnl-4 over FaSST and messages per packet".into(),
        x_label: "servers",
        y_label: "ratio / messages per packet",
        log_x: false,
        x: SERVERS.iter().map(|&n| f64::from(n)).collect(),
        series: vec![
            ("dnl-4 / fasst".into(), ratio),
            ("dnl-4 messages per packet".into(), degree),
        ],
    });

    // Fig. 22: load (transaction contexts per thread), SmallBank, 5 servers.
    let mut dnl = Vec::new();
    let mut fasst = Vec::new();
    for c in CONTEXTS {
        let m = mtps(&rows("smallbank", &["dnl-4", "fasst"], 5, c, false)?)?;
        dnl.push(m[0]);
        fasst.push(m[1]);
        bar.inc(1);
    }
    let n = CONTEXTS.len();
    out.claims.push(Claim::checked(
        "Fig. 22",
        format!(
            "dnl-4 Mtps, 128 / 64 contexts (8 -> 16: {:.2})",
            dnl[1] / dnl[0]
        ),
        f64::NAN,
        dnl[n - 1] / dnl[n - 2],
        "throughput climbs, then flattens at high load (> +20 % at 8 -> 16, < +10 % at 64 -> 128)",
        FLATTENS,
        dnl.clone(),
    ));
    out.figures.push(Figure {
        id: "fig22_contexts",
        title: "SmallBank, 5 servers: throughput vs transaction contexts per thread".into(),
        x_label: "contexts per thread",
        y_label: "Mtps",
        log_x: true,
        x: CONTEXTS.iter().map(|&c| f64::from(c)).collect(),
        series: vec![("dnl-4".into(), dnl), ("fasst".into(), fasst)],
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rule a Dandelion claim is judged by, with numbers that fail it and numbers
    /// that pass it.
    #[test]
    fn every_claim_can_fail_and_can_pass() {
        let table: [(&str, Rule, Vec<f64>, Vec<f64>); 5] = [
            (
                "dnl-4 ahead of fasst / a step gains",
                AHEAD,
                vec![3.0, 3.0],
                vec![3.1, 3.0],
            ),
            ("O(4,2) differ", DIFFER, vec![10.4, 10.0], vec![19.1, 10.0]),
            (
                "ahead at every size",
                AHEAD_AT_EVERY_SIZE,
                vec![3.9, 3.1, 2.7, 0.9],
                vec![3.9, 3.1, 2.7, 2.2],
            ),
            (
                "degree falls",
                DEGREE_FALLS,
                vec![11.6, 4.8, 5.0, 2.4],
                vec![11.6, 4.8, 3.3, 2.4],
            ),
            (
                "flattens",
                FLATTENS,
                // Still climbing 64 -> 128 (+15 %).
                vec![5.6, 7.2, 9.0, 10.1, 11.6],
                vec![5.6, 7.2, 9.0, 10.1, 9.2],
            ),
        ];
        for (name, rule, fail, pass) in table {
            assert!(!rule.holds(&fail), "{name} holds for {fail:?}");
            assert!(rule.holds(&pass), "{name} fails for {pass:?}");
        }
        // A curve that never climbed is not one that flattens.
        assert!(!FLATTENS.holds(&[5.6, 5.7, 5.8, 5.8, 5.8]));
    }
}

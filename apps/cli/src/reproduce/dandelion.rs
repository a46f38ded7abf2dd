//! Dandelion (SmallBank and TATP against FaSST §7, the O(G,P) micro-benchmarks of Figs.
//! 8–13, the ablation of Fig. 16/17, servers 3 → 10 of Fig. 18–21 with Tables 5/6's
//! batching degree, and the load sweep of Fig. 22)
//! on the simulated cluster: `cx5`, R = 3, 4 threads per server, as `dmem bench --servers N`
//! runs it. Why the figures differ from the paper's is in `protocol/dandelion/README.md`.

use anyhow::Context as _;

use super::{Claim, Figure, Outcome, Paper, num};

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
        out.claims.push(Claim::new(
            "§7",
            format!("{workload}: dnl-4 / fasst Mtps (5 servers)"),
            paper,
            m[1] / m[0],
            "dnl-4 ahead of fasst",
            m[1] > m[0],
        ));
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
        out.claims.push(Claim::new(
            "Figs. 8-13",
            format!("{name}: dnl-4 / fasst Mtps"),
            f64::NAN,
            m[1] / m[0],
            "dnl-4 ahead of fasst",
            m[1] > m[0],
        ));
        let (lo, hi) = m[1..]
            .iter()
            .fold((f64::INFINITY, 0.0_f64), |(lo, hi), &x| {
                (lo.min(x), hi.max(x))
            });
        let read_only = mix.ends_with("-0");
        if read_only || mix == "o4-2" {
            out.claims.push(Claim::new(
                "§8.1",
                format!("{name}: fastest / slowest of dnl-4, dnl-2, dnl-1 Mtps"),
                if read_only { 1.0 } else { f64::NAN },
                hi / lo,
                if read_only {
                    "the DNL protocols are one (Dnl-RO) on read-only mixes"
                } else {
                    "the DNL protocols differ on O(4,2)"
                },
                if read_only {
                    hi / lo < 1.001
                } else {
                    hi / lo > 1.05
                },
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
            out.claims.push(Claim::new(
                "Fig. 16/17",
                format!("{workload}: {step} / previous step Mtps"),
                paper[i],
                m[i + 1] / m[i],
                format!("{step} gains"),
                m[i + 1] > m[i],
            ));
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
    out.claims.push(Claim::new(
        "Fig. 18",
        "smallbank: dnl-4 / fasst Mtps at 10 servers",
        3.0,
        ratio[last],
        "dnl-4 ahead of fasst at every size",
        ratio.iter().all(|&r| r > 1.0),
    ));
    out.claims.push(Claim::new(
        "Table 6",
        "smallbank: dnl-4 msgs per packet, 3 servers / most (paper 9, here 10)",
        25.0 / 8.9,
        degree[0] / degree[last],
        "batching degree falls as servers grow",
        degree.windows(2).all(|w| w[1] <= w[0]),
    ));
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
    let peak = dnl.iter().copied().fold(f64::MIN, f64::max);
    out.claims.push(Claim::new(
        "Fig. 22",
        "dnl-4 Mtps at 128 contexts / its peak",
        f64::NAN,
        dnl[CONTEXTS.len() - 1] / peak,
        "throughput flattens at high load",
        dnl[CONTEXTS.len() - 1] / peak < 1.05,
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

//! OOCC (read-heavy workloads Fig. 10/12, the technique ladder Fig. 11, the lease sweep and
//! the lease manager Fig. 13, the offset sweep Fig. 14a) on the simulated cluster with the
//! paper's testbed shape (`cx6`, 2 CNs), as `dmem bench` runs it. The commands, and why
//! some figures differ from the paper's, are in `protocol/occ/README.md`.

use anyhow::Context as _;

use super::{Claim, Figure, Outcome, Paper, Rule, num};

pub(crate) const PAPER: Paper = Paper {
    name: "oocc",
    title: "OOCC: leases against OCC, DrTM and DSLR; techniques; lease and offset sweeps",
    run,
    steps: 5 + 1 + 1 + 1 + 1,
};

/// `[a, b]` Mtps: a ahead of b (OOCC over a baseline, a ladder step over the one before, a
/// lease over OCC, the manager over a fixed lease).
const AHEAD: Rule = Rule::Greater;
/// `[a, b]` Mtps: a behind b (a baseline ahead of OOCC, a far too long lease behind OCC).
const BEHIND: Rule = Rule::Less;
/// `[offset, no offset]` Mtps: an offset costs under 5 % (Fig. 14a).
const OFFSET_CHEAP: Rule = Rule::RatioAtLeast(0.95);

/// The measured reason OOCC / `baseline` on `what` is outside ±30 % of the paper's, from
/// `docs/results/occ.md`.
fn miss_reason(what: &str, baseline: &str) -> &'static str {
    match (what, baseline) {
        ("YCSB read-only", "occ") => {
            "setup: a read-only txn here reads one record, which OCC commits without validation in dmem as in the artifact (smart-oocc dtx/dtx.h TxCommit, as FORD's code): 1.00 READ, 1 round trip, as OOCC; the artifact's YCSB txns read data_item_size = 2 records (config/transaction-bak.json), which its OCC validates with two more READs (here with two records, --mix o2-0: oocc / occ 2.00)"
        }
        ("YCSB read-only", _) => {
            "setup: these runs do not saturate the MN (busy 9-17 %); the paper's gaps come from the NIC's atomic throughput at saturation"
        }
        ("TPC-C (8 warehouses)", "occ") => {
            "model: OOCC's 80 us write-wait lease holds each write lock 80 us longer on rows most txns write; the paper's 1.1x needs the artifact's read-write rules, not serializable here (oocc:artifact-rw)"
        }
        ("YCSB unknown read set", "drtm") | ("YCSB read-intensive", "drtm") => {
            "setup: zipf 0.99 here (the paper's Fig. 10 keys are uniform): hot records always carry DrTM's 400 us read lease, which every writer waits out"
        }
        _ => super::NOT_EXPLAINED,
    }
}

/// Every run's shape: the paper's testbed (ConnectX-6, 2 CNs), 3 ms measured.
const SHAPE: [&str; 6] = ["--profile", "cx6", "--cns", "2", "--duration-ms", "3"];

/// `dmem bench` with [`SHAPE`], `workload` (flags) and `protocols`: each protocol's Mtps, in
/// order, after checking that the checker and the invariants passed.
fn mtps(workload: &[&str], protocols: &[&str]) -> anyhow::Result<Vec<f64>> {
    let list = protocols.join(",");
    let mut argv: Vec<&str> = SHAPE.to_vec();
    argv.extend_from_slice(workload);
    argv.extend_from_slice(&["--protocol", &list]);
    let rows = dmem_cli::bench_txn::measure(&argv, &dmem_protocols::registry())
        .with_context(|| format!("dmem bench {}", argv.join(" ")))?;
    rows.iter()
        .map(|row| {
            anyhow::ensure!(
                row["checker"] == "ok" && row["invariants"] == "ok",
                "a correctness check failed: {row}"
            );
            num(row, "mtps")
        })
        .collect()
}

const YCSB_RO: [&str; 6] = [
    "--workload",
    "ycsb",
    "--mix",
    "read-only",
    "--scale",
    "small",
];
const YCSB_RI: [&str; 6] = [
    "--workload",
    "ycsb",
    "--mix",
    "read-intensive",
    "--scale",
    "small",
];

/// TPC-C as §VIII-E runs it: 8 warehouses (`--scale ford`), the Table IV mix, 8 threads x 4
/// coroutines = 32 coordinators (here 2 CNs x 4 threads x 4 coroutines), and as OOCC's
/// artifact runs its benchmarks: an aborted transaction is dropped, not retried
/// (`--attempts 1`).
const TPCC: [&str; 12] = [
    "--workload",
    "tpcc",
    "--scale",
    "ford",
    "--mix",
    "oocc",
    "--threads",
    "4",
    "--coroutines",
    "4",
    "--attempts",
    "1",
];

/// The OCC baseline for TPC-C like for like: OOCC with every technique off (the base of
/// Fig. 11), on OOCC's store — one copy of each record and one redo log per transaction,
/// as OOCC, DrTM and DSLR here and all four in OOCC's artifact. `occ` (FORD) keeps three
/// replicas and undo-logs to each (the crate README).
const TPCC_OCC: &str = "oocc:lease=10+fixed-lease+no-lease+no-delayed-lock+no-one-op-unlock";

fn run(bar: &indicatif::ProgressBar) -> anyhow::Result<Outcome> {
    let mut out = Outcome::default();
    // OOCC at the micro-benchmark lease of §VIII-G (10 µs), fixed (`fixed-lease`: the
    // figures compare techniques and leases, the manager has Fig. 13d); the artifact's
    // 100 µs is far too long for a closed loop of 64 coordinators (see the crate README).
    let baselines = ["oocc:lease=10+fixed-lease", "occ", "drtm", "dslr"];

    // Fig. 10 / Fig. 12: OOCC against each baseline.
    // The paper's OOCC / X throughput (NaN: the paper gives no single figure).
    let workloads: [(&'static str, &str, &[&str], [f64; 3]); 5] = [
        ("Fig. 10", "YCSB read-only", &YCSB_RO, [2.0, 3.3, 2.8]),
        (
            "Fig. 10",
            "YCSB read-intensive",
            &YCSB_RI,
            [1.2, f64::NAN, f64::NAN],
        ),
        (
            "Fig. 12",
            "TATP",
            &["--workload", "tatp", "--scale", "small"],
            [1.2, f64::NAN, f64::NAN],
        ),
        // §VIII-E: 8 warehouses, Table IV's mix, 32 coordinators (2 CNs x 4 x 4), lease
        // 80 µs, aborted transactions dropped; all four on OOCC's store (see `TPCC_OCC`).
        ("Fig. 12", "TPC-C (8 warehouses)", &TPCC, [1.1, 3.1, 0.7]),
        // §III-C: two reads, then two keys derived from them; the paper's lease is 12 µs.
        (
            "§VIII-C",
            "YCSB unknown read set",
            &[
                "--workload",
                "ycsb",
                "--mix",
                "unknown-read-set",
                "--scale",
                "small",
            ],
            [1.7, 2.3, 2.1],
        ),
    ];
    for (figure, what, workload, paper) in workloads {
        let mut protocols = baselines;
        if figure == "§VIII-C" {
            protocols[0] = "oocc:lease=12+fixed-lease";
        }
        if workload == TPCC.as_slice() {
            protocols = ["oocc:lease=80+fixed-lease", TPCC_OCC, "drtm", "dslr"];
        }
        let m = mtps(workload, &protocols)?;
        for (i, name) in ["occ", "drtm", "dslr"].iter().enumerate() {
            if paper[i].is_nan() {
                continue;
            }
            let ratio = m[0] / m[i + 1];
            let (ordering, rule) = if paper[i] >= 1.0 {
                (format!("oocc ahead of {name}"), AHEAD)
            } else {
                (format!("{name} ahead of oocc"), BEHIND)
            };
            out.claims.push(
                Claim::checked(
                    figure,
                    format!("{what}: oocc / {name} Mtps"),
                    paper[i],
                    ratio,
                    ordering,
                    rule,
                    vec![m[0], m[i + 1]],
                )
                .miss(miss_reason(what, name)),
            );
        }
        bar.inc(1);
    }

    // Fig. 11: the technique ladder on YCSB read-intensive (θ = 0.99).
    let ladder = [
        (
            "OCC on OOCC's store",
            "oocc:lease=10+fixed-lease+no-lease+no-delayed-lock+no-one-op-unlock",
        ),
        (
            "+ lease",
            "oocc:lease=10+fixed-lease+no-delayed-lock+no-one-op-unlock",
        ),
        (
            "+ write unlock",
            "oocc:lease=10+fixed-lease+no-delayed-lock",
        ),
        ("+ delayed write lock", "oocc:lease=10+fixed-lease"),
    ];
    let m = mtps(&YCSB_RI, &ladder.map(|(_, p)| p))?;
    let paper_steps = [f64::NAN, 1.28, 1.05, 1.1];
    for i in 1..ladder.len() {
        out.claims.push(Claim::checked(
            "Fig. 11",
            format!("{} / previous step Mtps", ladder[i].0),
            paper_steps[i],
            m[i] / m[i - 1],
            format!("{} gains", ladder[i].0),
            AHEAD,
            vec![m[i], m[i - 1]],
        ));
    }
    out.figures.push(Figure {
        id: "fig11_techniques",
        title: "Technique ladder, YCSB read-intensive (x: step 1..4)".into(),
        x_label: "step",
        y_label: "Mtps",
        log_x: false,
        x: (1..=ladder.len()).map(|i| i as f64).collect(),
        series: vec![("oocc".into(), m)],
    });
    bar.inc(1);

    // Fig. 13a: the lease sweep, OOCC / OCC.
    let leases = [2.0, 4.0, 7.0, 10.0, 14.0, 25.0, 100.0];
    let names: Vec<String> = leases
        .iter()
        .map(|l| format!("oocc:lease={l}+fixed-lease"))
        .chain(std::iter::once("occ".into()))
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let m = mtps(&YCSB_RI, &names)?;
    let occ = m[leases.len()];
    let rel: Vec<f64> = m[..leases.len()].iter().map(|x| x / occ).collect();
    let best = m[..leases.len()].iter().copied().fold(f64::MIN, f64::max);
    out.claims.push(Claim::checked(
        "Fig. 13a",
        "best lease: oocc / occ Mtps",
        f64::NAN,
        best / occ,
        "a well-chosen lease beats occ",
        AHEAD,
        vec![best, occ],
    ));
    out.claims.push(Claim::checked(
        "Fig. 13a",
        "100 µs lease: oocc / occ Mtps",
        f64::NAN,
        rel[leases.len() - 1],
        "a lease far too long loses to occ",
        BEHIND,
        vec![m[leases.len() - 1], occ],
    ));
    out.figures.push(Figure {
        id: "fig13a_lease_sweep",
        title: "Lease sweep, YCSB read-intensive: OOCC / OCC".into(),
        x_label: "lease (µs)",
        y_label: "OOCC / OCC throughput",
        log_x: true,
        x: leases.to_vec(),
        series: vec![("oocc / occ".into(), rel)],
    });
    bar.inc(1);

    // Fig. 13d: the lease manager raising a too-small lease.
    let m = mtps(&YCSB_RI, &["oocc:lease=2+fixed-lease", "oocc:lease=2"])?;
    out.claims.push(Claim::checked(
        "Fig. 13d",
        "lease manager from 2 µs / fixed 2 µs Mtps",
        1.5,
        m[1] / m[0],
        "the manager raises a too-small lease",
        AHEAD,
        vec![m[1], m[0]],
    ));
    bar.inc(1);

    // Fig. 14a: the clock-drift offset at lease 10 µs.
    let offsets = [0.0, 0.5, 1.0, 1.5];
    let names: Vec<String> = offsets
        .iter()
        .map(|o| format!("oocc:lease=10+fixed-lease+offset={o}"))
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let m = mtps(&YCSB_RI, &names)?;
    for (i, o) in offsets.iter().enumerate().skip(1).take(2) {
        out.claims.push(Claim::checked(
            "Fig. 14a",
            format!("offset {o} µs / offset 0 Mtps"),
            1.0,
            m[i] / m[0],
            "an offset of at most 1 µs costs under 5 %",
            OFFSET_CHEAP,
            vec![m[i], m[0]],
        ));
    }
    out.figures.push(Figure {
        id: "fig14a_offset",
        title: "Offset sweep at lease 10 µs, YCSB read-intensive".into(),
        x_label: "offset (µs)",
        y_label: "Mtps",
        log_x: false,
        x: offsets.to_vec(),
        series: vec![("oocc".into(), m)],
    });
    bar.inc(1);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rule an OOCC claim is judged by, with numbers that fail it and numbers that
    /// pass it.
    #[test]
    fn every_claim_can_fail_and_can_pass() {
        let table: [(&str, Rule, Vec<f64>, Vec<f64>); 3] = [
            // OOCC vs OCC on read-only YCSB: equal is not ahead.
            ("ahead", AHEAD, vec![9.8, 9.8], vec![10.1, 9.8]),
            ("behind", BEHIND, vec![2.1, 2.0], vec![0.8, 2.0]),
            (
                "offset cheap",
                OFFSET_CHEAP,
                vec![9.4, 10.0],
                vec![9.6, 10.0],
            ),
        ];
        for (name, rule, fail, pass) in table {
            assert!(!rule.holds(&fail), "{name} holds for {fail:?}");
            assert!(rule.holds(&pass), "{name} fails for {pass:?}");
        }
    }

    #[test]
    fn a_known_miss_has_a_reason_and_an_unknown_one_says_so() {
        assert!(miss_reason("YCSB read-only", "occ").starts_with("setup"));
        assert_eq!(miss_reason("TATP", "occ"), super::super::NOT_EXPLAINED);
    }
}

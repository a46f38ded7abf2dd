//! What the nodes of a cluster run report (one JSON line each on stdout) and what `dmem
//! cluster` makes of them: the MN and CN reports of the `faa` and transaction workloads,
//! the checks over them, and the summary tables.

use std::cell::RefCell;
use std::collections::BTreeMap;

use dmem_deploy::{Decision, RecoveredCoordinator, settle_history};
use dmem_txn::History;
use serde::{Deserialize, Serialize};

use dmem_cli::bench_txn::{ProcessTally, Row};
use dmem_cli::common;
use hdrhistogram::Histogram;
use serde_json::{Map, Value};

use super::config::Cluster;

/// What an MN reports at the end (one JSON line on stdout).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct MnReport {
    pub(crate) role: String,
    pub(crate) name: String,
    pub(crate) node: u16,
    /// The shared word.
    pub(crate) shared: u64,
    /// Each CN's word, by CN name.
    pub(crate) words: BTreeMap<String, u64>,
    /// CNs that said they were done, with their post counts.
    pub(crate) done: BTreeMap<String, u64>,
    /// CNs whose access was revoked, with the ms from the start of detection.
    pub(crate) revoked: BTreeMap<String, u64>,
}

/// What a CN reports at the end (one JSON line on stdout).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct CnReport {
    pub(crate) role: String,
    pub(crate) name: String,
    pub(crate) node: u16,
    /// Post lists completed.
    pub(crate) posts: u64,
    pub(crate) batch: u32,
    /// Post lists per second.
    pub(crate) posts_per_s: f64,
    /// The executor each client thread ran on (`glommio`, pinned, or `polling`).
    pub(crate) executor: String,
    /// Why not glommio, when the polling executor ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) executor_why: Option<String>,
    /// Errors that stopped clients.
    pub(crate) errors: Vec<String>,
}

/// Every violated property of a `faa` run, as readable lines.
pub(crate) fn check_faa(
    cluster: &Cluster,
    killed: Option<&str>,
    cns: &[(String, bool, Option<CnReport>)],
    mns: &[(String, bool, Option<MnReport>)],
) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, ok, report) in mns {
        let Some(r) = report.as_ref().filter(|_| *ok) else {
            problems.push(format!("MN `{name}` failed or printed no report"));
            continue;
        };
        let sum: u64 = r.words.values().sum();
        if sum != r.shared {
            problems.push(format!(
                "MN `{name}`: shared word {} != sum of CN words {sum}",
                r.shared
            ));
        }
        for cn in cluster.cns() {
            let is_killed = killed == Some(cn.name.as_str());
            match (is_killed, r.revoked.contains_key(&cn.name)) {
                (true, false) => problems.push(format!(
                    "MN `{name}` never revoked the killed CN `{}`",
                    cn.name
                )),
                (false, true) => problems.push(format!(
                    "MN `{name}` revoked the live CN `{}` (false suspicion)",
                    cn.name
                )),
                _ => {}
            }
        }
    }
    for (name, ok, report) in cns {
        if killed == Some(name.as_str()) {
            continue;
        }
        let Some(r) = report.as_ref().filter(|_| *ok) else {
            problems.push(format!("CN `{name}` failed or printed no report"));
            continue;
        };
        if r.posts == 0 {
            problems.push(format!("CN `{name}` completed no post"));
        }
        let expected = r.posts * u64::from(r.batch);
        for (mn, _, m) in mns {
            if let Some(m) = m
                && m.words.get(name) != Some(&expected)
            {
                problems.push(format!(
                    "MN `{mn}` holds {:?} in CN `{name}`'s word, expected {expected} ({} posts x batch {})",
                    m.words.get(name),
                    r.posts,
                    r.batch
                ));
            }
        }
    }
    problems
}

/// Prints the node table of a `faa` run.
pub(crate) fn print_faa_summary(
    cluster: &Cluster,
    cns: &[(String, bool, Option<CnReport>)],
    mns: &[(String, bool, Option<MnReport>)],
) {
    println!(
        "dmem cluster  {}  fabric tcp  {} MN  {} CN x {} threads x {} clients  batch {}  {} ms",
        cluster.path().display(),
        cluster.mns().len(),
        cluster.cns().len(),
        cluster.threads(),
        cluster.clients(),
        cluster.batch(),
        cluster.duration().as_millis()
    );
    let mut t = common::table(&["node", "role", "exit", "posts", "posts/s", "note"]);
    for (name, ok, r) in cns {
        t.add_row(vec![
            name.clone(),
            "cn".into(),
            if *ok { "ok".into() } else { "failed".into() },
            r.as_ref().map_or("-".into(), |r| r.posts.to_string()),
            r.as_ref()
                .map_or("-".into(), |r| format!("{:.0}", r.posts_per_s)),
            r.as_ref()
                .map_or("no report (killed?)".into(), |r| r.errors.join("; ")),
        ]);
    }
    for (name, ok, r) in mns {
        let note = r.as_ref().map_or("no report".into(), |r| {
            let revoked: Vec<String> = r
                .revoked
                .iter()
                .map(|(cn, ms)| format!("{cn} at {ms} ms"))
                .collect();
            format!(
                "shared {} = sum of CN words; revoked: {}",
                r.shared,
                if revoked.is_empty() {
                    "none".into()
                } else {
                    revoked.join(", ")
                }
            )
        });
        t.add_row(vec![
            name.clone(),
            "mn".into(),
            if *ok { "ok".into() } else { "failed".into() },
            "-".into(),
            "-".into(),
            note,
        ]);
    }
    println!("{}", common::render(&t));
}

/// What an MN reports in a transaction run.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TxnMnReport {
    pub(crate) role: String,
    pub(crate) name: String,
    /// CNs whose access was revoked.
    pub(crate) revoked: Vec<String>,
}

/// One CN failure recovered by the first CN.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Recovered {
    pub(crate) cn: String,
    /// Coordinator ids recovered.
    pub(crate) coordinators: Vec<u16>,
    /// Per coordinator: its in-flight transaction's fate (`roll-forward`, `roll-back`, `none`).
    pub(crate) decisions: Vec<String>,
    pub(crate) detected_ms: u64,
    /// Per coordinator: the sequence number of the transaction recovery decided.
    #[serde(default)]
    pub(crate) txns: Vec<Option<u64>>,
    /// When recovery finished (`CLOCK_MONOTONIC` ns), if the decisions settle the recovered
    /// coordinators' `Unknown` transactions in the merged history
    /// (`dmem_deploy::process::ProcessRecovery::settles_history`).
    #[serde(default)]
    pub(crate) settle_at: Option<u64>,
}

impl Recovered {
    /// Writes the decisions into the merged `history` (`dmem_deploy::settle_history`), if
    /// the protocol's recovery settles it.
    fn settle(&self, history: &RefCell<History>) {
        let Some(now) = self.settle_at else {
            return;
        };
        for (i, &coordinator) in self.coordinators.iter().enumerate() {
            let decision = match self.decisions.get(i).map(String::as_str) {
                Some("roll-forward") => Some(Decision::RollForward),
                Some("roll-back") => Some(Decision::RollBack),
                _ => None,
            };
            let r = RecoveredCoordinator {
                coordinator,
                txn: self.txns.get(i).copied().flatten(),
                decision,
                restored: 0,
                unlocked: 0,
            };
            settle_history(history, &r, now);
        }
    }
}

/// One MN failure handled by the first CN (Pandora §3.2.5).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct MnFailed {
    /// The failed MN.
    pub(crate) mn: String,
    /// When the detector confirmed it, ms after the first CN's run started.
    pub(crate) detected_ms: u64,
    /// When every live CN had acknowledged and was resumed; `None` if that never happened.
    pub(crate) resumed_ms: Option<u64>,
}

/// What a CN reports in a transaction run.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TxnCnReport {
    pub(crate) role: String,
    pub(crate) name: String,
    pub(crate) committed: u64,
    pub(crate) rolled_back: u64,
    /// Transactions given up (the sum of [`given_up`](Self::given_up)).
    pub(crate) failed: u64,
    pub(crate) delta: i64,
    /// Tries per transaction (the cluster file's `attempts`).
    #[serde(default)]
    pub(crate) attempts: u32,
    /// Failed attempts by reason (`dmem_harness::failure_reason`: the protocol's abort
    /// reason, else the error), the last try of a transaction given up included.
    #[serde(default)]
    pub(crate) aborts: BTreeMap<String, u64>,
    /// Transactions given up, by their last error.
    #[serde(default)]
    pub(crate) given_up: BTreeMap<String, u64>,
    /// First CN only: the CN failures it recovered.
    pub(crate) recovered: Vec<Recovered>,
    /// First CN only: the MN failures it handled.
    #[serde(default)]
    pub(crate) mn_failures: Vec<MnFailed>,
    /// First CN only: the workload's invariants over the final state, read after every CN
    /// finished or was recovered (`ok`, the violations, or why they were skipped).
    pub(crate) invariants: String,
    /// The executor each of its cores ran on (`glommio`, pinned, or `polling`).
    #[serde(default)]
    pub(crate) executor: String,
    /// Why not glommio, when the polling executor ran.
    #[serde(default)]
    pub(crate) executor_why: Option<String>,
    /// Its cores (executors), each running its share of the coordinators.
    #[serde(default)]
    pub(crate) threads: u32,
    /// Its first core's deployment's counters at the end (`Deployment::counters`; LOTUS:
    /// the CN's lock table, shared by its cores).
    #[serde(default)]
    pub(crate) counters: BTreeMap<String, u64>,
    /// Per core, the MNs its view counted as failed when its coordinators were done
    /// (`ProcessDeployment::failed_mns`; Pandora §3.2.5: an MN failure reaches every core's view).
    #[serde(default)]
    pub(crate) failed_mns_by_core: Vec<Vec<String>>,
    /// Cores whose deployment ran the workload's loader again after the process's dry run
    /// (0 where every core took the dry run's placement: `Protocol::deploy_placed`).
    #[serde(default)]
    pub(crate) core_loads: u64,
    /// Tries its coordinators made (every attempt of every transaction).
    #[serde(default)]
    pub(crate) tries: u64,
    /// Its coordinators' window, ns of its `CLOCK_MONOTONIC`: from their start to the last
    /// one's end.
    #[serde(default)]
    pub(crate) window_ns: u64,
    /// Latency of its committed transactions (first begin to commit, retries included):
    /// `(ns, count)` per recorded bucket of its hdrhistogram (3 significant digits), merged
    /// by `dmem cluster` into the run's percentiles.
    #[serde(default)]
    pub(crate) latency_ns: Vec<(u64, u64)>,
    /// Committed transactions per type.
    #[serde(default)]
    pub(crate) committed_per_type: BTreeMap<String, u64>,
}

/// The outcome of a transaction run, as `dmem cluster` checked it.
pub(crate) struct TxnVerdict {
    /// The history checker's verdict (`ok` or the first anomaly).
    pub(crate) checker: String,
    /// Transactions in the merged history it judged.
    pub(crate) checked_txns: usize,
    pub(crate) invariants: String,
    pub(crate) problems: Vec<String>,
}

/// `dmem cluster`'s part of a transaction run, once the CNs have exited: merge the
/// histories (the killed CN's streamed records included), check them, and check the
/// workload's invariants over the final state the first CN read.
pub(crate) fn collect(
    cluster: &Cluster,
    killed: Option<&str>,
    killed_mn: Option<&str>,
    cns: &[(String, bool, Option<TxnCnReport>)],
    histories: Vec<History>,
) -> anyhow::Result<TxnVerdict> {
    let mut problems = Vec::new();
    let mut history = History::new();
    for h in histories {
        history.txns.extend(h.txns);
    }
    // Recovery's decisions for the failed CNs' in-flight transactions, as the simulator's
    // recovery of the same protocol writes them.
    let history = RefCell::new(history);
    for r in cns.iter().filter_map(|(_, _, r)| r.as_ref()) {
        r.recovered.iter().for_each(|rec| rec.settle(&history));
    }
    let history = history.into_inner();
    cn_problems(killed, cns, &mut problems);
    let first = &cluster.cns()[0].name;
    let first_report = cns
        .iter()
        .find(|(name, _, _)| name == first)
        .and_then(|(_, _, r)| r.as_ref());
    mn_failure_problems(killed_mn, first_report, &mut problems);
    let invariants = cns
        .iter()
        .find(|(name, _, _)| name == first)
        .and_then(|(_, _, r)| r.as_ref())
        .map_or_else(
            || format!("unknown (the first CN `{first}` printed no report)"),
            |r| r.invariants.clone(),
        );
    if invariants != "ok" && !invariants.starts_with("skipped") {
        problems.push(format!("invariants: {invariants}"));
    }
    // Judged at the isolation the protocol promises (`motor-si`, `lotus-si`: snapshot
    // isolation, where write skew is allowed), as the simulator's runs are.
    let isolation = cluster
        .protocol()
        .and_then(|name| dmem_protocols::registry().get(name).ok())
        .map_or(dmem_txn::Isolation::Serializable, |p| p.isolation());
    let checker = dmem_harness::verdict_under(&history, isolation);
    if checker != "ok" {
        problems.push(format!("history checker: {checker}"));
    }
    Ok(TxnVerdict {
        checker,
        checked_txns: history.txns.len(),
        invariants,
        problems,
    })
}

/// What the CNs' reports say is wrong: a live CN that failed, committed nothing or was
/// recovered; a killed CN that was not.
fn cn_problems(
    killed: Option<&str>,
    cns: &[(String, bool, Option<TxnCnReport>)],
    problems: &mut Vec<String>,
) {
    for (name, ok, report) in cns {
        if killed == Some(name.as_str()) {
            continue;
        }
        let Some(r) = report.as_ref().filter(|_| *ok) else {
            problems.push(format!("CN `{name}` failed or printed no report"));
            continue;
        };
        if r.committed == 0 {
            problems.push(format!("CN `{name}` committed nothing"));
        }
        for rec in &r.recovered {
            if killed != Some(rec.cn.as_str()) {
                problems.push(format!(
                    "the live CN `{}` was recovered (false suspicion)",
                    rec.cn
                ));
            }
        }
    }
    if let Some(k) = killed {
        let recovered = cns
            .iter()
            .filter_map(|(_, _, r)| r.as_ref())
            .any(|r| r.recovered.iter().any(|rec| rec.cn == k));
        if !recovered {
            problems.push(format!("the killed CN `{k}` was not recovered"));
        }
    }
}

/// What the first CN's handling of MN failures says is wrong: a live MN counted as failed,
/// CNs never resumed, a killed MN not detected.
fn mn_failure_problems(
    killed_mn: Option<&str>,
    first_report: Option<&TxnCnReport>,
    problems: &mut Vec<String>,
) {
    let handled: Vec<&MnFailed> =
        first_report.map_or(Vec::new(), |r| r.mn_failures.iter().collect());
    for failure in &handled {
        if killed_mn != Some(failure.mn.as_str()) {
            problems.push(format!(
                "the live MN `{}` was counted as failed",
                failure.mn
            ));
        } else if failure.resumed_ms.is_none() {
            problems.push(format!(
                "the CNs were never resumed after MN `{}` failed",
                failure.mn
            ));
        }
    }
    if let Some(k) = killed_mn
        && !handled.iter().any(|f| f.mn == k)
    {
        problems.push(format!("the killed MN `{k}` was not detected"));
    }
}

/// Prints the CN table of a transaction run.
pub(crate) fn print_txn_summary(
    cluster: &Cluster,
    protocol: &str,
    cns: &[(String, bool, Option<TxnCnReport>)],
    verdict: &TxnVerdict,
) {
    let nodes = if cluster.symmetric() {
        format!("{} servers", cluster.cns().len())
    } else {
        format!("{} MN  {} CN", cluster.mn_count(), cluster.cns().len())
    };
    println!(
        "dmem cluster  {}  fabric {}  protocol {protocol}  {nodes} x {} coordinators  {} ms  {} attempts",
        cluster.path().display(),
        cluster.fabric_name(),
        cluster.clients(),
        cluster.duration().as_millis(),
        cluster.attempts()
    );
    let mut t = common::table(&[
        "node",
        "exit",
        "committed",
        "Mtps",
        "p50 µs",
        "p99 µs",
        "rolled back",
        "given up",
        "aborts",
        "executor",
        "recovered",
    ]);
    for (name, ok, r) in cns {
        let recovered = r.as_ref().map_or(String::new(), |r| {
            r.recovered
                .iter()
                .map(|rec| {
                    format!(
                        "{} at {} ms: {}",
                        rec.cn,
                        rec.detected_ms,
                        rec.decisions.join(",")
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        });
        t.add_row(vec![
            name.clone(),
            if *ok {
                "ok".into()
            } else {
                "killed/failed".into()
            },
            r.as_ref().map_or("-".into(), |r| r.committed.to_string()),
            figure(r.as_ref(), "mtps", 4),
            figure(r.as_ref(), "p50_us", 1),
            figure(r.as_ref(), "p99_us", 1),
            r.as_ref().map_or("-".into(), |r| r.rolled_back.to_string()),
            r.as_ref().map_or("-".into(), |r| r.failed.to_string()),
            r.as_ref()
                .map_or("-".into(), |r| r.aborts.values().sum::<u64>().to_string()),
            r.as_ref()
                .map_or("-".into(), |r| format!("{} x {}", r.threads, r.executor)),
            recovered,
        ]);
    }
    println!("{}", common::render(&t));
    print_txn_totals(cns);
    println!(
        "checker: {} ({} transactions)  invariants: {}",
        verdict.checker, verdict.checked_txns, verdict.invariants
    );
}

/// A CN's figure of its node row ([`node_figures`]) for its table, `-` where it has none.
fn figure(r: Option<&TxnCnReport>, name: &str, digits: usize) -> String {
    r.and_then(|r| node_figures(r).get(name).and_then(Value::as_f64))
        .map_or_else(|| "-".to_owned(), |x| format!("{x:.digits$}"))
}

/// The lines below a transaction run's table: aborts and transactions given up by reason,
/// LOTUS's lock refusals, and the MN failures, over every CN that reported.
fn print_txn_totals(cns: &[(String, bool, Option<TxnCnReport>)]) {
    let mut aborts = BTreeMap::new();
    let mut given_up = BTreeMap::new();
    for r in cns.iter().filter_map(|(_, _, r)| r.as_ref()) {
        for (reason, n) in &r.aborts {
            *aborts.entry(reason.clone()).or_insert(0) += n;
        }
        for (error, n) in &r.given_up {
            *given_up.entry(error.clone()).or_insert(0) += n;
        }
    }
    if !aborts.is_empty() {
        println!("aborts by reason: {}", common::by_count(&aborts));
    }
    if !given_up.is_empty() {
        println!("given up by error: {}", common::by_count(&given_up));
    }
    // LOTUS: each CN's refusals (on its table by reason, met by its coordinators by what
    // the lock was for), summed over the CNs.
    let mut refused = BTreeMap::new();
    for r in cns.iter().filter_map(|(_, _, r)| r.as_ref()) {
        for (name, n) in r
            .counters
            .iter()
            .filter(|(k, _)| k.starts_with("lotus_refused_"))
        {
            *refused.entry(name.clone()).or_insert(0) += n;
        }
    }
    if refused.values().any(|&n| n > 0) {
        println!("lock refusals: {}", common::by_count(&refused));
    }
    for r in cns.iter().filter_map(|(_, _, r)| r.as_ref()) {
        for f in &r.mn_failures {
            println!(
                "MN failure: {} detected by {} at {} ms, CNs resumed {}",
                f.mn,
                r.name,
                f.detected_ms,
                f.resumed_ms
                    .map_or_else(|| "never".to_owned(), |t| format!("at {t} ms"))
            );
        }
    }
}

/// A latency histogram from a CN's `(ns, count)` buckets ([`TxnCnReport::latency_ns`]).
fn histogram(buckets: &[(u64, u64)]) -> Option<Histogram<u64>> {
    let mut h = Histogram::new_with_bounds(1, 60_000_000_000, 3).ok()?;
    for &(value, count) in buckets {
        h.record_n(value, count).ok()?;
    }
    Some(h)
}

/// The figures of the schema's row ([`Row`]) for one CN (its commits over its own window,
/// its tries, its latency histogram), as fields of its node row.
fn node_figures(r: &TxnCnReport) -> Map<String, Value> {
    let latency = histogram(&r.latency_ns).filter(|h| !h.is_empty());
    let quantile = |q: f64| {
        latency
            .as_ref()
            .map(|h| common::round(h.value_at_quantile(q) as f64 / 1e3, 2))
    };
    let finished = r.committed + r.rolled_back;
    let mut m = Map::new();
    m.insert(
        "mtps".into(),
        Value::from(common::round(
            r.committed as f64 / r.window_ns.max(1) as f64 * 1e3,
            6,
        )),
    );
    m.insert(
        "abort_rate".into(),
        Value::from(common::round(
            r.tries.saturating_sub(finished) as f64 / r.tries.max(1) as f64,
            4,
        )),
    );
    m.insert("p50_us".into(), quantile(0.5).into());
    m.insert("p99_us".into(), quantile(0.99).into());
    m.insert(
        "window_ms".into(),
        Value::from(common::round(r.window_ns as f64 / 1e6, 1)),
    );
    m
}

/// One node's row: `node` (its name), `protocol`, `exit` (`ok` or `failed`), `figures`, then
/// every field of its report but the latency buckets (merged into the protocol row).
fn node_row(
    name: &str,
    protocol: &str,
    ok: bool,
    figures: Map<String, Value>,
    report: &impl Serialize,
) -> anyhow::Result<Value> {
    let mut m = Map::new();
    m.insert("node".into(), Value::from(name));
    m.insert("protocol".into(), Value::from(protocol));
    m.insert("exit".into(), Value::from(if ok { "ok" } else { "failed" }));
    m.extend(figures);
    if let Value::Object(fields) = serde_json::to_value(report)? {
        for (k, v) in fields {
            if k != "latency_ns" {
                m.insert(k, v);
            }
        }
    }
    Ok(Value::Object(m))
}

/// The rows of a transaction run across processes: the protocol's row of the schema every
/// fabric prints ([`Row::across_processes`]: the CNs' commits, tries, windows, latency
/// histograms and counters summed or merged, the checker's and the invariants' verdicts),
/// and one row per node that reported ([`node_row`]: CNs, then MNs).
pub(crate) fn txn_rows(
    cluster: &Cluster,
    protocol: &str,
    cns: &[(String, bool, Option<TxnCnReport>)],
    mns: &[(String, bool, Option<TxnMnReport>)],
    verdict: &TxnVerdict,
) -> anyhow::Result<(Row, Vec<Value>)> {
    let mut tally = ProcessTally::default();
    let mut latency: Option<Histogram<u64>> = None;
    let mut nodes = Vec::new();
    for (name, ok, r) in cns {
        let Some(r) = r else { continue };
        tally.committed += r.committed;
        tally.rolled_back += r.rolled_back;
        tally.failed += r.failed;
        tally.attempts += r.tries;
        tally.window_ns = tally.window_ns.max(r.window_ns);
        for (map, from) in [
            (&mut tally.counters, &r.counters),
            (&mut tally.aborts_by_reason, &r.aborts),
            (&mut tally.committed_per_type, &r.committed_per_type),
        ] {
            for (k, v) in from {
                *map.entry(k.clone()).or_default() += v;
            }
        }
        if let Some(h) = histogram(&r.latency_ns) {
            match latency.as_mut() {
                Some(all) => all.add(&h).map_err(|e| anyhow::anyhow!("{e:?}"))?,
                None => latency = Some(h),
            }
        }
        nodes.push(node_row(name, protocol, *ok, node_figures(r), r)?);
    }
    for (name, ok, r) in mns {
        if let Some(r) = r {
            nodes.push(node_row(name, protocol, *ok, Map::new(), r)?);
        }
    }
    tally.latency = latency.filter(|h| !h.is_empty());
    let (workload, scale) = match cluster.kind() {
        super::config::Kind::Txn {
            workload, scale, ..
        } => (workload.clone(), scale.name().to_owned()),
        super::config::Kind::Faa => ("faa".to_owned(), String::new()),
    };
    let row = Row::across_processes(
        protocol,
        &workload,
        &scale,
        u64::try_from(cluster.duration().as_millis()).unwrap_or(u64::MAX),
        &cluster.backoff().to_string(),
        tally,
        verdict.checker.clone(),
        verdict.checked_txns,
        verdict.invariants.clone(),
    );
    Ok((row, nodes))
}

//! `dmem cluster`: starts every node of a cluster file as a separate process on this host
//! (inside the node's network namespace when it names one), optionally kills a CN (and an
//! MN) with SIGKILL mid-run, collects the reports and checks them; `dmem cluster
//! up|status|down`, the same run in the background; and `dmem bench --fabric tcp|shm`
//! ([`bench_cluster`]), a generated cluster file per protocol run the same way.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use clap::Args as ClapArgs;
use dmem_cli::bench_txn::{self, TcpShape};
use dmem_cli::common::{CheckFailed, Sink};
use dmem_verbs::NodeId;
use serde::{Deserialize, Serialize};

use super::config::{Cluster, Fabric, Kind};
use super::control::is_ready_line;
use super::history::history_from_lines;
use super::net::quit_mns_from_outside;
use super::report::{
    CnReport, MnReport, TxnCnReport, TxnMnReport, TxnVerdict, check_faa, collect,
    print_faa_summary, print_txn_summary, txn_rows,
};
use super::setup::TxnSetup;

/// Arguments of `dmem cluster`.
#[derive(Debug, ClapArgs)]
pub(crate) struct ClusterArgs {
    /// Without an action: run the cluster in the foreground and report. `up`: start that run
    /// in the background (its own process group, output to a log file); `status`: whether
    /// it still runs, and its log's last lines; `down`: stop it and every node it started.
    #[arg(value_enum)]
    pub(crate) action: Option<Action>,
    /// The cluster file.
    #[arg(long, value_name = "FILE")]
    cluster: PathBuf,
    /// Kill this CN with SIGKILL during the run; or this MN, for FORD and Pandora with
    /// replication (Pandora §3.2.5). At most one CN and one MN (`--kill cn1,mn1`: both at
    /// once, in that order).
    #[arg(long, value_name = "NODE", value_delimiter = ',')]
    kill: Vec<String>,
    /// When to kill it, ms after the CNs started.
    #[arg(long, default_value_t = 500)]
    kill_after_ms: u64,
    /// Print JSON lines instead of tables: for a transaction workload the protocol's row
    /// (the schema of `dmem bench --json`), one row per node that reported (`node`: its
    /// name, with its report), then a summary; for `faa`, each node's report.
    #[arg(long)]
    json: bool,
    /// Also write the rows of a transaction run to this CSV file (the columns of `dmem bench
    /// --csv`).
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
}

/// A node process started by `dmem cluster`.
struct Started {
    name: String,
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    reader: std::thread::JoinHandle<()>,
    ready: Arc<AtomicBool>,
}

fn start_node(
    cluster: &Cluster,
    role: &str,
    name: &str,
    netns: Option<&str>,
) -> anyhow::Result<Started> {
    let exe = std::env::current_exe().context("cannot find the dmem executable")?;
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    cmd.arg(role)
        .arg("--cluster")
        .arg(cluster.path())
        .arg("--node")
        .arg(name)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start `dmem {role}` for node `{name}`"))?;
    let stdout = child.stdout.take().context("piped stdout")?;
    let lines = Arc::new(Mutex::new(Vec::new()));
    let ready = Arc::new(AtomicBool::new(false));
    let (reader_lines, reader_ready) = (Arc::clone(&lines), Arc::clone(&ready));
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if is_ready_line(&line) {
                reader_ready.store(true, Ordering::SeqCst);
            }
            dmem_verbs::sync::lock_ignoring_poison(&reader_lines).push(line);
        }
    });
    Ok(Started {
        name: name.to_owned(),
        child,
        lines,
        reader,
        ready,
    })
}

/// The node's exit status and its last stdout line that parses as `T`.
fn finish<T: for<'de> Deserialize<'de>>(node: Started) -> (String, bool, Option<T>) {
    let (name, ok, report, _) = finish_with_lines(node);
    (name, ok, report)
}

/// [`finish`], and every stdout line of the node.
fn finish_with_lines<T: for<'de> Deserialize<'de>>(
    mut node: Started,
) -> (String, bool, Option<T>, Vec<String>) {
    let ok = node.child.wait().is_ok_and(|s| s.success());
    let _ = node.reader.join();
    let lines = dmem_verbs::sync::lock_ignoring_poison(&node.lines).clone();
    let report = lines
        .iter()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok());
    (node.name, ok, report, lines)
}

/// What `dmem cluster up|status|down` does with a background run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Action {
    /// Start the run in the background.
    Up,
    /// Report the background run.
    Status,
    /// Stop the background run and its nodes.
    Down,
}

/// Where a background run of `file` keeps its process group id, log and exit status: a
/// directory per cluster file (its canonical path, `/` → `_`) under the temp directory.
fn background_dir(file: &Path) -> anyhow::Result<PathBuf> {
    let canonical = file
        .canonicalize()
        .with_context(|| format!("cannot find cluster file {}", file.display()))?;
    let key: String = canonical
        .to_string_lossy()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    Ok(std::env::temp_dir().join("dmem-cluster").join(key))
}

/// Whether process `pid` exists and is not a zombie (`/proc/PID/stat`'s state).
fn process_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X')
    })
}

/// `dmem cluster up|status|down`: a background run of `dmem cluster` for a quick try.
fn background(action: Action, args: &ClusterArgs) -> anyhow::Result<()> {
    let background = Background::of(&args.cluster)?;
    match action {
        Action::Up => background.up(args),
        Action::Status => background.status(args),
        Action::Down => background.down(args),
    }
}

/// The files of the background run of one cluster file ([`background_dir`]).
struct Background {
    dir: PathBuf,
    /// The run's process group id.
    pid_file: PathBuf,
    /// Its stdout and stderr.
    log: PathBuf,
    /// Its exit status, once it ended.
    exit_file: PathBuf,
}

impl Background {
    fn of(file: &Path) -> anyhow::Result<Self> {
        let dir = background_dir(file)?;
        Ok(Self {
            pid_file: dir.join("pgid"),
            log: dir.join("log"),
            exit_file: dir.join("exit"),
            dir,
        })
    }

    /// The process group of the run, while it runs.
    fn running(&self) -> Option<i32> {
        let pid = std::fs::read_to_string(&self.pid_file)
            .ok()?
            .trim()
            .parse()
            .ok()?;
        (!self.exit_file.exists() && process_alive(pid)).then_some(pid)
    }

    /// `up`: starts the run in its own process group, its output to the log.
    fn up(&self, args: &ClusterArgs) -> anyhow::Result<()> {
        // Validated now, so that a bad file is one line here, not in a log.
        Cluster::load(&args.cluster)?;
        if let Some(pid) = self.running() {
            bail!(
                "a run of {} is already up (process group {pid}): `dmem cluster down --cluster {}` first",
                args.cluster.display(),
                args.cluster.display()
            );
        }
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("cannot create {}", self.dir.display()))?;
        let _ = std::fs::remove_file(&self.exit_file);
        let exe = std::env::current_exe().context("cannot find the dmem executable")?;
        let mut run = vec![
            exe.to_string_lossy().into_owned(),
            "cluster".into(),
            "--cluster".into(),
            args.cluster.to_string_lossy().into_owned(),
        ];
        if !args.kill.is_empty() {
            run.extend(["--kill".into(), args.kill.join(",")]);
            run.extend(["--kill-after-ms".into(), args.kill_after_ms.to_string()]);
        }
        if args.json {
            run.push("--json".into());
        }
        if let Some(csv) = &args.csv {
            run.extend(["--csv".into(), csv.to_string_lossy().into_owned()]);
        }
        // A shell in a new process group runs the foreground command and writes its exit
        // status when it ends; `down` signals the whole group (the run and its nodes).
        let child = Command::new("sh")
            .arg("-c")
            .arg(r#""$@" > "$DMEM_LOG" 2>&1; echo $? > "$DMEM_EXIT""#)
            .arg("sh")
            .args(&run)
            .env("DMEM_LOG", &self.log)
            .env("DMEM_EXIT", &self.exit_file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .context("cannot start the background run")?;
        std::fs::write(&self.pid_file, child.id().to_string())
            .with_context(|| format!("cannot write {}", self.pid_file.display()))?;
        println!(
            "dmem cluster: {} is up (process group {}); log {}; `dmem cluster status|down --cluster {}`",
            args.cluster.display(),
            child.id(),
            self.log.display(),
            args.cluster.display()
        );
        Ok(())
    }

    /// `status`: whether the run still runs, and its log's last lines.
    fn status(&self, args: &ClusterArgs) -> anyhow::Result<()> {
        let state = match (self.running(), std::fs::read_to_string(&self.exit_file)) {
            (Some(pid), _) => format!("running (process group {pid})"),
            (None, Ok(code)) => format!("finished, exit status {}", code.trim()),
            (None, Err(_)) if self.pid_file.exists() => "stopped (by `down` or a signal)".into(),
            (None, Err(_)) => {
                println!("dmem cluster: {} is not up", args.cluster.display());
                return Ok(());
            }
        };
        println!(
            "dmem cluster: {}: {state}; log {}",
            args.cluster.display(),
            self.log.display()
        );
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        for line in &lines[lines.len().saturating_sub(12)..] {
            println!("  {line}");
        }
        Ok(())
    }

    /// `down`: kills the run's process group (the run and every node it started).
    fn down(&self, args: &ClusterArgs) -> anyhow::Result<()> {
        let Some(pid) = self.running() else {
            println!("dmem cluster: {} is not running", args.cluster.display());
            return Ok(());
        };
        let group = rustix::process::Pid::from_raw(pid).context("a bad process group id")?;
        rustix::process::kill_process_group(group, rustix::process::Signal::KILL)
            .with_context(|| format!("cannot stop process group {pid}"))?;
        println!(
            "dmem cluster: {} is down (process group {pid} killed)",
            args.cluster.display()
        );
        Ok(())
    }
}

/// `dmem cluster`.
pub(crate) fn run_cluster(args: &ClusterArgs) -> anyhow::Result<()> {
    if let Some(action) = args.action {
        return background(action, args);
    }
    let cluster = Cluster::load(&args.cluster)?;
    let Some(run) = run_nodes(args, &cluster)? else {
        return Ok(());
    };
    let mut sink = Sink::new(args.json, args.csv.as_deref())?.with_columns(bench_txn::CSV_COLUMNS);
    run.emit(&mut sink)?;
    if !args.json {
        run.print(&cluster);
        bench_txn::print_table(std::slice::from_ref(&run.row));
    }
    let failed: Vec<&str> = if run.problems.is_empty() {
        Vec::new()
    } else {
        vec![run.protocol.as_str()]
    };
    sink.finish(
        "cluster",
        &RunConfig::of(&cluster, args),
        serde_json::json!({ "check_failed": failed }),
    )?;
    run.result()
}

/// The configuration in the summary of `dmem cluster --json`: the keys of `dmem bench`'s
/// configuration that a cluster file sets (workload, scale, protocol, fabric, nodes,
/// threads, coordinators per thread, duration), and the file and kills.
#[derive(Debug, Serialize)]
struct RunConfig {
    cluster: PathBuf,
    workload: String,
    scale: Option<String>,
    protocol: Vec<String>,
    fabric: &'static str,
    mns: usize,
    cns: usize,
    /// Cores (executor threads) per CN.
    threads: u32,
    /// Coordinators per core (the file's `clients` dealt out to its `threads`).
    coroutines: u32,
    duration_ms: u64,
    attempts: u32,
    backoff: String,
    kill: Vec<String>,
    kill_after_ms: u64,
}

impl RunConfig {
    fn of(cluster: &Cluster, args: &ClusterArgs) -> Self {
        let (workload, scale) = match cluster.kind() {
            Kind::Txn {
                workload, scale, ..
            } => (workload.clone(), Some(scale.name().to_owned())),
            Kind::Faa => ("faa".to_owned(), None),
        };
        Self {
            cluster: args.cluster.clone(),
            workload,
            scale,
            protocol: cluster.protocol().map(str::to_owned).into_iter().collect(),
            fabric: cluster.fabric_name(),
            mns: cluster.mns().len(),
            cns: cluster.cns().len(),
            threads: cluster.threads(),
            coroutines: cluster.clients().div_ceil(cluster.threads().max(1)),
            duration_ms: u64::try_from(cluster.duration().as_millis()).unwrap_or(u64::MAX),
            attempts: cluster.attempts(),
            backoff: cluster.backoff().to_string(),
            kill: args.kill.clone(),
            kill_after_ms: args.kill_after_ms,
        }
    }
}

/// Starts the nodes of `cluster`, kills what `--kill` names, and waits for the end: a
/// `faa` run is checked and printed here (`None`); a transaction run is returned checked,
/// for its caller to print ([`TxnRun`]).
fn run_nodes(args: &ClusterArgs, cluster: &Cluster) -> anyhow::Result<Option<TxnRun>> {
    let Kills {
        mn: kill_mn,
        cn: kill_cn,
        setup,
    } = Kills::check(args, cluster)?;
    let mut mns = Vec::new();
    let mut cns = Vec::new();
    // Stop every started child if anything below fails.
    let result = start_nodes(cluster, &mut mns, &mut cns).and_then(|()| {
        if args.kill.is_empty() {
            Ok(())
        } else {
            kill_nodes(args, cluster, kill_mn, &mut mns, &mut cns)
        }
    });
    if let Err(e) = result {
        for node in mns.iter_mut().chain(cns.iter_mut()) {
            let _ = node.child.kill();
            let _ = node.child.wait();
        }
        return Err(e);
    }
    match (&setup, cluster.kind()) {
        (Some(_), Kind::Txn { protocol, .. }) => {
            finish_txn_run(cluster, protocol, (kill_cn, kill_mn), mns, cns).map(Some)
        }
        _ => finish_faa_run(args, cluster, kill_cn, mns, cns).map(|()| None),
    }
}

/// A transaction run across processes, checked: its rows in the schema of every fabric
/// (the protocol's [`bench_txn::Row`], one row per node that reported) and what its
/// checks found.
pub(crate) struct TxnRun {
    protocol: String,
    row: bench_txn::Row,
    nodes: Vec<serde_json::Value>,
    cns: Vec<(String, bool, Option<TxnCnReport>)>,
    verdict: TxnVerdict,
    problems: Vec<String>,
}

impl TxnRun {
    /// Its rows to `sink`: the protocol's row, then the nodes'.
    fn emit(&self, sink: &mut Sink) -> anyhow::Result<()> {
        sink.row(&self.row)?;
        for node in &self.nodes {
            sink.row(node)?;
        }
        Ok(())
    }

    /// Its node table, totals and verdicts (the human output beside the protocol table).
    fn print(&self, cluster: &Cluster) {
        print_txn_summary(cluster, &self.protocol, &self.cns, &self.verdict);
    }

    /// `Ok`, or the problems its checks found as a [`CheckFailed`].
    fn result(&self) -> anyhow::Result<()> {
        if self.problems.is_empty() {
            Ok(())
        } else {
            Err(CheckFailed(format!(
                "cluster check failed: {}",
                self.problems.join("; ")
            ))
            .into())
        }
    }
}

/// The nodes `--kill` names, checked against the cluster, and the run's deployment.
struct Kills<'a> {
    mn: Option<&'a str>,
    cn: Option<&'a str>,
    setup: Option<TxnSetup>,
}

impl<'a> Kills<'a> {
    /// Refuses, with one line why, a kill that the run cannot survive or would not notice.
    fn check(args: &'a ClusterArgs, cluster: &Cluster) -> anyhow::Result<Self> {
        let (kill_mns, kill_cns): (Vec<&str>, Vec<&str>) = args
            .kill
            .iter()
            .map(String::as_str)
            .partition(|k| cluster.mns().iter().any(|m| m.name == *k));
        ensure!(
            kill_mns.len() <= 1 && kill_cns.len() <= 1,
            "--kill {}: at most one CN and one MN per run",
            args.kill.join(",")
        );
        let (kill_mn, kill_cn) = (kill_mns.first().copied(), kill_cns.first().copied());
        if let Some(kill) = kill_cn {
            cluster.cn(kill)?;
            ensure!(
                !cluster.symmetric(),
                "--kill {kill}: protocol `{}` recovers a crashed server on the simulator only (Dandelion §4.4: its detector reads the simulator's crash state; `dmem recover`); server processes are not recovered",
                cluster.protocol().unwrap_or_default()
            );
            if matches!(cluster.kind(), Kind::Txn { .. }) {
                ensure!(
                    cluster.cns()[0].name != *kill,
                    "--kill {kill}: the first CN runs the failure detector and recovery; kill another"
                );
            }
        }
        let setup = TxnSetup::of(cluster)?;
        if let (Some(kill), Some(setup), Kind::Txn { protocol, .. }) =
            (args.kill.first(), &setup, cluster.kind())
        {
            ensure!(
                setup.recovers()?,
                "--kill {kill}: protocol `{protocol}` has no recovery across processes yet (ford, pandora, motor, oocc, drtm, dslr and lotus do)"
            );
        }
        if let Some(setup) = &setup {
            setup.check_threads(cluster.threads())?;
        }
        // Every CN resolves the executor the same way: one line here rather than one per CN.
        cluster
            .executor()
            .resolve()
            .map_err(|e| anyhow::anyhow!("{}: {e}", cluster.path().display()))?;
        if let (Some(kill), Fabric::Shm { .. }) = (kill_mn, cluster.fabric()) {
            bail!(
                "--kill {kill}: on shm an MN's memory outlives its process (every CN keeps its mapping), so killing it fails nothing; to kill an MN run the cluster on tcp (fabric = \"tcp\", a protocol with replicas: examples/clusters/smallbank-3mn-2cn.toml), or kill a CN"
            );
        }
        if let Some(kill) = kill_mn {
            let Some(setup) = &setup else {
                bail!("--kill {kill}: an MN can be killed in transaction runs only");
            };
            ensure!(
                setup.recovers()? && setup.replicas()? > 1,
                "--kill {kill}: an MN failure is survived by FORD and Pandora with replication only (this run keeps {} cop{} of each record)",
                setup.replicas()?,
                if setup.replicas()? == 1 { "y" } else { "ies" }
            );
        }
        Ok(Kills {
            mn: kill_mn,
            cn: kill_cn,
            setup,
        })
    }
}

/// Starts every MN, waits until they are ready, then starts every CN (or server).
fn start_nodes(
    cluster: &Cluster,
    mns: &mut Vec<Started>,
    cns: &mut Vec<Started>,
) -> anyhow::Result<()> {
    for mn in cluster.mns() {
        mns.push(start_node(cluster, "mn", &mn.name, mn.netns())?);
    }
    let deadline = Instant::now() + cluster.join_timeout();
    while !mns.iter().all(|m| m.ready.load(Ordering::SeqCst)) {
        for m in mns.iter_mut() {
            if matches!(m.child.try_wait(), Ok(Some(_))) {
                bail!(
                    "MN `{}` exited before it was ready (its error is above)",
                    m.name
                );
            }
        }
        ensure!(
            Instant::now() < deadline,
            "the MNs were not ready within the join timeout"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    for cn in cluster.cns() {
        cns.push(start_node(
            cluster,
            cluster.cn_role(),
            &cn.name,
            cn.netns(),
        )?);
    }
    Ok(())
}

/// `--kill`: once every CN is ready, waits `--kill-after-ms`, then kills each named node
/// with SIGKILL.
fn kill_nodes(
    args: &ClusterArgs,
    cluster: &Cluster,
    kill_mn: Option<&str>,
    mns: &mut [Started],
    cns: &mut [Started],
) -> anyhow::Result<()> {
    // The kill timer starts once every CN is connected and heartbeating.
    let deadline = Instant::now() + cluster.join_timeout();
    while !cns.iter().all(|c| c.ready.load(Ordering::SeqCst)) {
        for c in cns.iter_mut() {
            // A CN that was ready may have finished already; the kill says so.
            if !c.ready.load(Ordering::SeqCst) && matches!(c.child.try_wait(), Ok(Some(_))) {
                bail!(
                    "CN `{}` exited before it was ready (its error is above)",
                    c.name
                );
            }
        }
        ensure!(
            Instant::now() < deadline,
            "the CNs were not ready within the join timeout"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(args.kill_after_ms));
    for kill in &args.kill {
        let role = if kill_mn == Some(kill.as_str()) {
            "MN"
        } else {
            "CN"
        };
        let victim = cns
            .iter_mut()
            .chain(mns.iter_mut())
            .find(|c| &c.name == kill)
            .context("checked above")?;
        ensure!(
            matches!(victim.child.try_wait(), Ok(None)),
            "{role} `{kill}` finished before --kill-after-ms {} ms: raise the workload's duration_ms",
            args.kill_after_ms
        );
        victim
            .child
            .kill()
            .with_context(|| format!("cannot kill {role} `{kill}`"))?;
        eprintln!(
            "dmem cluster: killed {role} `{kill}` with SIGKILL after {} ms",
            args.kill_after_ms
        );
    }
    Ok(())
}

/// The end of a transaction run: collect the CNs' reports and histories, check them, make
/// sure the MNs quit, collect theirs; the run's rows.
fn finish_txn_run(
    cluster: &Cluster,
    protocol: &str,
    (kill_cn, kill_mn): (Option<&str>, Option<&str>),
    mns: Vec<Started>,
    cns: Vec<Started>,
) -> anyhow::Result<TxnRun> {
    let mut histories = Vec::new();
    let cn_results: Vec<(String, bool, Option<TxnCnReport>)> = cns
        .into_iter()
        .map(|node| {
            let (name, ok, report, lines) = finish_with_lines(node);
            histories.push(history_from_lines(&lines));
            (name, ok, report)
        })
        .collect();
    // Every CN exited: the state they kept for one another's recovery is done with.
    let _ = std::fs::remove_dir_all(cluster.state_dir());
    let verdict = collect(cluster, kill_cn, kill_mn, &cn_results, histories);
    // The first CN tells the MNs to quit once its report is out; without that report
    // (it failed, e.g. refused the workload) the MNs would wait out their time limit.
    let first_cn_reported = cn_results
        .first()
        .is_some_and(|(_, ok, report)| *ok && report.is_some());
    if verdict.is_err() || !first_cn_reported {
        // The MNs wait for a quit that no CN got to send.
        let dead: Vec<NodeId> = cluster
            .mns()
            .iter()
            .filter(|m| Some(m.name.as_str()) == kill_mn)
            .map(|m| m.node)
            .collect();
        if let Err(e) = quit_mns_from_outside(cluster, &dead) {
            eprintln!("dmem cluster: cannot tell the MNs to quit: {e}");
        }
    }
    let mn_results: Vec<(String, bool, Option<TxnMnReport>)> =
        mns.into_iter().map(finish).collect();
    let mut verdict = verdict?;
    for (name, ok, report) in &mn_results {
        // The killed MN's report is missing by design.
        if (!ok || report.is_none()) && kill_mn != Some(name.as_str()) {
            verdict
                .problems
                .push(format!("MN `{name}` failed or printed no report"));
        }
    }
    let (row, nodes) = txn_rows(cluster, protocol, &cn_results, &mn_results, &verdict)?;
    let problems = std::mem::take(&mut verdict.problems);
    Ok(TxnRun {
        protocol: protocol.to_owned(),
        row,
        nodes,
        cns: cn_results,
        verdict,
        problems,
    })
}

/// The end of a `faa` run: collect the reports, check them, print.
fn finish_faa_run(
    args: &ClusterArgs,
    cluster: &Cluster,
    kill_cn: Option<&str>,
    mns: Vec<Started>,
    cns: Vec<Started>,
) -> anyhow::Result<()> {
    let cn_results: Vec<(String, bool, Option<CnReport>)> = cns.into_iter().map(finish).collect();
    let mn_results: Vec<(String, bool, Option<MnReport>)> = mns.into_iter().map(finish).collect();
    let problems = check_faa(cluster, kill_cn, &cn_results, &mn_results);
    if args.json {
        print_json_reports(&cn_results)?;
        print_json_reports(&mn_results)?;
    } else {
        print_faa_summary(cluster, &cn_results, &mn_results);
    }
    if problems.is_empty() {
        if !args.json {
            println!(
                "check: ok (every MN's shared word is the sum of the CN words; every finished CN's word is its posts x batch; the killed CN, if any, was revoked at every MN and no other CN was)"
            );
        }
        Ok(())
    } else {
        Err(CheckFailed(format!("cluster check failed: {}", problems.join("; "))).into())
    }
}

/// Prints every report that `results` holds as one JSON line.
fn print_json_reports<T: Serialize>(results: &[(String, bool, Option<T>)]) -> anyhow::Result<()> {
    for r in results.iter().filter_map(|(_, _, r)| r.as_ref()) {
        println!("{}", serde_json::to_string(r)?);
    }
    Ok(())
}

/// `dmem bench --fabric tcp|shm`: for each protocol, a local cluster of separate MN and CN
/// processes on this host (a generated cluster file in a temporary directory: loopback
/// addresses on tcp, Unix sockets on shm; on tcp, `--servers` server processes for a
/// symmetric protocol), run by [`run_cluster`]: histories collected and checked, invariants
/// checked, cluster stopped.
pub(crate) fn bench_cluster(args: &bench_txn::Args) -> anyhow::Result<()> {
    // Refuses the simulator-only flags (message faults) with one line.
    args.message_faults(&dmem_protocols::registry())?;
    let fabric = args.fabric();
    let tcp = args.tcp_shape();
    let dir = std::env::temp_dir().join(format!(
        "dmem-bench-{}-{}",
        fabric.name(),
        std::process::id()
    ));
    let mut sink = Sink::new(tcp.json, tcp.csv.as_deref())?.with_columns(bench_txn::CSV_COLUMNS);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let result = bench_protocols(&tcp, fabric, &dir, &mut sink);
    let _ = std::fs::remove_dir_all(&dir);
    let runs = result?;
    let rows: Vec<bench_txn::Row> = runs.iter().map(|r| r.row.clone()).collect();
    if !tcp.json {
        let registry = dmem_protocols::registry();
        let symmetric = tcp
            .protocols
            .iter()
            .any(|p| registry.get(p).is_ok_and(|p| p.symmetric()));
        let nodes = if symmetric && tcp.cluster.is_none() {
            format!(" ({} servers if symmetric)", tcp.servers)
        } else {
            String::new()
        };
        println!(
            "dmem bench  workload {} ({} scale)  {} processes  {} MN  {} CN{nodes} x {} coordinators  {} ms real time  {} attempts  backoff {}",
            tcp.workload,
            tcp.scale,
            fabric.name(),
            tcp.mns,
            tcp.cns,
            tcp.coordinators_per_cn,
            tcp.duration_ms,
            tcp.attempts,
            tcp.backoff
        );
        bench_txn::print_table(&rows);
    }
    let problems: Vec<(String, String)> = runs
        .iter()
        .flat_map(|r| r.problems.iter().map(|p| (r.protocol.clone(), p.clone())))
        .collect();
    let verdicts = rows.iter().map(|r| {
        (
            r.protocol.as_str(),
            r.checker.as_str(),
            r.invariants.as_str(),
            r.committed,
        )
    });
    bench_txn::finish_checked(sink, args, verdicts, &problems)
}

/// Runs each protocol of `tcp` in a local cluster of processes (a generated cluster file
/// under `dir`), its rows to `sink` and, without `--json`, its node table printed as it
/// ends.
fn bench_protocols(
    tcp: &TcpShape,
    fabric: bench_txn::TxnFabric,
    dir: &Path,
    sink: &mut Sink,
) -> anyhow::Result<Vec<TxnRun>> {
    let mut runs = Vec::new();
    for protocol in &tcp.protocols {
        let workload = format!(
            "\n[workload]\nkind = \"{}\"\nprotocol = \"{protocol}\"\nscale = \"{}\"\nduration_ms = {}\nthreads = 1\nclients = {}\nattempts = {}\nbackoff = \"{}\"\n",
            tcp.workload,
            tcp.scale,
            tcp.duration_ms,
            tcp.coordinators_per_cn,
            tcp.attempts,
            tcp.backoff
        );
        let text = cluster_file_text(tcp, protocol, &workload, fabric, dir)?;
        let path = dir.join(format!("{protocol}.toml"));
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        let args = ClusterArgs {
            action: None,
            cluster: path,
            kill: Vec::new(),
            kill_after_ms: 0,
            json: tcp.json,
            csv: None,
        };
        let cluster = Cluster::load(&args.cluster)?;
        let run = run_nodes(&args, &cluster)?.context("a transaction workload's run has rows")?;
        run.emit(sink)?;
        if !tcp.json {
            run.print(&cluster);
        }
        runs.push(run);
    }
    Ok(runs)
}

/// The cluster file of `dmem bench --fabric tcp|shm` for `protocol`: `--cluster`'s nodes
/// and settings with this run's `workload` table, or a local cluster of `tcp.mns` MNs and
/// `tcp.cns` CNs (or `tcp.servers` servers of a symmetric protocol) on free loopback ports
/// (tcp) or Unix sockets under `dir` (shm).
fn cluster_file_text(
    tcp: &TcpShape,
    protocol: &str,
    workload: &str,
    fabric: bench_txn::TxnFabric,
    dir: &Path,
) -> anyhow::Result<String> {
    let shm = fabric == bench_txn::TxnFabric::Shm;
    Ok(match &tcp.cluster {
        // The file's nodes and settings, with this run's workload.
        Some(file) => file_with_workload(file, workload, fabric)?,
        None if shm => {
            let mut text = format!(
                "fabric = \"shm\"\nsocket_dir = \"{}\"\njoin_timeout_ms = 60000\n{workload}",
                dir.join("sockets").display()
            );
            for m in 0..usize::from(tcp.mns) {
                text += &format!("\n[[node]]\nname = \"mn{m}\"\nrole = \"mn\"\n");
            }
            for c in 0..usize::from(tcp.cns) {
                text += &format!("\n[[node]]\nname = \"cn{c}\"\nrole = \"cn\"\n");
            }
            text
        }
        None if dmem_protocols::registry()
            .get(protocol)
            .is_ok_and(|p| p.symmetric()) =>
        {
            ensure!(
                fabric != bench_txn::TxnFabric::Rdma,
                "--fabric rdma: {protocol}'s servers exchange batched RPCs, which need queue pairs between servers; dmem does not make those yet (run it on tcp or shm)"
            );
            // A symmetric protocol's servers: one free loopback port each.
            let listeners = (0..tcp.servers)
                .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
                .collect::<Result<Vec<_>, _>>()
                .context("cannot find free loopback ports")?;
            let mut text = format!("fabric = \"tcp\"\njoin_timeout_ms = 60000\n{workload}");
            for (s, l) in listeners.iter().enumerate() {
                text += &format!(
                    "\n[[node]]\nname = \"s{s}\"\nrole = \"server\"\ncontrol = \"127.0.0.1:{}\"\n",
                    l.local_addr()?.port()
                );
            }
            text
        }
        None => loopback_mns_and_cns(tcp, workload, fabric)?,
    })
}

/// `--cluster FILE`'s text with this run's `workload` table instead of the file's, once
/// its fabric is the one `--fabric` asked for.
fn file_with_workload(
    file: &Path,
    workload: &str,
    fabric: bench_txn::TxnFabric,
) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read cluster file {}", file.display()))?;
    let mut table: toml::Table = toml::from_str(&text).map_err(|e| {
        anyhow::anyhow!(
            "cluster file {}: {}",
            file.display(),
            e.message().trim_end()
        )
    })?;
    let wanted = fabric.name();
    let written = table.get("fabric").and_then(toml::Value::as_str);
    ensure!(
        written == Some(wanted),
        "cluster file {}: fabric = {:?}, but --fabric {wanted} was asked for",
        file.display(),
        written.unwrap_or("(missing)")
    );
    table.remove("workload");
    let workload: toml::Table = toml::from_str(workload)?;
    table.extend(workload);
    Ok(toml::to_string(&table)?)
}

/// A local tcp (or rdma) cluster of `tcp.mns` MNs and `tcp.cns` CNs on free loopback ports, running
/// `workload`.
fn loopback_mns_and_cns(
    tcp: &TcpShape,
    workload: &str,
    fabric: bench_txn::TxnFabric,
) -> anyhow::Result<String> {
    // Free loopback ports: two per MN, one per CN.
    let listeners = (0..2 * usize::from(tcp.mns) + usize::from(tcp.cns))
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .context("cannot find free loopback ports")?;
    let ports: Vec<u16> = listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<_, _>>()?;
    drop(listeners);
    // Each MN process creates and loads its store before it is ready: a
    // small-scale MVCC store (Motor, 3 × 0.5 GiB) takes longer than the default
    // 10 s join timeout on a busy host.
    let mut text = format!(
        "fabric = \"{}\"\njoin_timeout_ms = 60000\n{workload}",
        fabric.name()
    );
    if fabric == bench_txn::TxnFabric::Rdma {
        // Registering each coordinator's queue pairs and staging memory takes a soft-RoCE
        // NIC (rdma_rxe) tens of ms per context, so a CN still connecting would miss
        // heartbeats at tcp's 250 ms; and under emulation on a loaded host a LOTUS CN
        // serving lock RPCs once went 2 s without one. A bench kills nothing, so a long
        // timeout costs nothing and a false suspicion would fail the run.
        text.insert_str(0, "timeout_ms = 10000\n");
    }
    for m in 0..usize::from(tcp.mns) {
        text += &format!(
            "\n[[node]]\nname = \"mn{m}\"\nrole = \"mn\"\ndata = \"127.0.0.1:{}\"\ncontrol = \"127.0.0.1:{}\"\n",
            ports[2 * m],
            ports[2 * m + 1]
        );
    }
    for c in 0..usize::from(tcp.cns) {
        text += &format!(
            "\n[[node]]\nname = \"cn{c}\"\nrole = \"cn\"\ncontrol = \"127.0.0.1:{}\"\n",
            ports[2 * usize::from(tcp.mns) + c]
        );
    }
    Ok(text)
}

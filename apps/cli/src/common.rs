//! What every `dmem` command shares: exit codes, the one-line error style, limits checked
//! before any work (memory against `/proc/meminfo`), NIC profiles by name or file, list
//! checks, and the output path (tables through `comfy-table`, JSON lines, `--csv`, progress
//! bars on stderr).

use std::fmt;
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use dmem_sim::{MessageFaults, NicProfile};
use serde::Serialize;
use serde_json::Value;

/// Exit code of a run that worked (and whose checks passed).
pub const EXIT_OK: i32 = 0;
/// Exit code of an error: a bad flag, a run that could not be built or would not fit.
pub const EXIT_ERROR: i32 = 1;
/// Exit code of a run that finished but whose check failed: the history checker, the
/// workload's invariants, a litmus violation, or a paper's ordering that did not hold.
pub const EXIT_CHECK_FAILED: i32 = 3;

/// A check failed: the run is a result (printed), and the process exits with
/// [`EXIT_CHECK_FAILED`].
#[derive(Debug)]
pub struct CheckFailed(pub String);

impl fmt::Display for CheckFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CheckFailed {}

/// The exit code for an error: [`EXIT_CHECK_FAILED`] for a [`CheckFailed`], else
/// [`EXIT_ERROR`].
#[must_use]
pub fn exit_code(err: &anyhow::Error) -> i32 {
    if err.downcast_ref::<CheckFailed>().is_some() {
        EXIT_CHECK_FAILED
    } else {
        EXIT_ERROR
    }
}

/// One line for an error and its causes (`what: because`), newlines folded.
#[must_use]
pub fn one_line(err: &anyhow::Error) -> String {
    fold(&format!("{err:#}"))
}

fn fold(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// One line for a clap usage error, without clap's own `error:` prefix, usage block and
/// help hint.
#[must_use]
pub fn clap_error_line(err: &clap::Error) -> String {
    let text = err.render().to_string();
    let mut parts = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with("For more information") {
            continue;
        }
        if line.starts_with("Usage:") {
            break;
        }
        parts.push(line.strip_prefix("error: ").unwrap_or(line).to_string());
    }
    let mut line = String::new();
    for part in parts {
        if !line.is_empty() {
            line.push_str(if line.ends_with(':') { " " } else { "; " });
        }
        line.push_str(&part);
    }
    if line.contains("'-")
        && line
            .split("'-")
            .skip(1)
            .any(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
    {
        line.push_str(" (negative numbers are not accepted here)");
    }
    line
}

/// The machine's available memory, bytes (`MemAvailable` of `/proc/meminfo`), if known.
#[must_use]
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Bytes in a readable unit.
#[must_use]
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Fails unless `bytes` (`None`: more than 2^64) of memory fit in this machine's available
/// memory (less a quarter for everything else); the error says how much `what` would take
/// and what to lower.
///
/// # Errors
/// The estimate is larger than the memory available.
pub fn ensure_memory(bytes: Option<u64>, what: &str, lower: &str) -> anyhow::Result<()> {
    let available = available_memory();
    let budget = available.map_or(u64::MAX, |a| a / 4 * 3);
    match bytes {
        Some(b) if b <= budget => Ok(()),
        Some(b) => bail!(
            "{what} would take about {} of memory but this machine has {} available, of which dmem uses at most three quarters ({}): lower {lower}",
            human_bytes(b),
            available.map_or_else(|| "less".to_string(), human_bytes),
            human_bytes(budget)
        ),
        None => bail!("{what} would take more than 2^64 bytes of memory: lower {lower}"),
    }
}

/// Two-sided message faults from the `--msg-loss`, `--msg-dup`, `--msg-delay` and
/// `--msg-delay-ns` flags of `dmem bench` and `dmem litmus`, each probability checked to be
/// in [0, 1].
///
/// # Errors
/// A line naming the flag whose probability is outside [0, 1].
pub fn message_faults(
    loss: f64,
    duplicate: f64,
    delay: f64,
    delay_ns: u64,
) -> anyhow::Result<MessageFaults> {
    for (flag, p) in [
        ("--msg-loss", loss),
        ("--msg-dup", duplicate),
        ("--msg-delay", delay),
    ] {
        if !(0.0..=1.0).contains(&p) {
            bail!("{flag} {p} is outside [0, 1]");
        }
    }
    Ok(MessageFaults {
        loss,
        duplicate,
        delay,
        delay_ns,
    })
}

/// A product of sizes, `None` on overflow.
#[must_use]
pub fn product(factors: &[u64]) -> Option<u64> {
    factors.iter().try_fold(1u64, |acc, &f| acc.checked_mul(f))
}

/// A NIC profile: a built-in name (cx3, cx4, cx5, cx6) or the path of a TOML file with
/// every field of `dmem_sim::NicProfile` (see `examples/profiles/`).
///
/// # Errors
/// An unknown name, a file that cannot be read, or a file that is not a valid profile.
pub fn load_profile(name_or_path: &str) -> anyhow::Result<NicProfile> {
    if let Ok(profile) = NicProfile::named(name_or_path) {
        return Ok(profile);
    }
    let path = Path::new(name_or_path);
    let looks_like_path = name_or_path.contains('/')
        || name_or_path.contains('\\')
        || path.extension().is_some_and(|e| e == "toml");
    if !path.exists() {
        if looks_like_path {
            bail!("--profile {name_or_path}: no such file");
        }
        bail!(
            "unknown --profile `{name_or_path}`: use cx3, cx4, cx5, cx6 or the path of a TOML profile file (see examples/profiles/)"
        );
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read --profile file {name_or_path}"))?;
    let profile =
        NicProfile::from_toml(&text).with_context(|| format!("--profile file {name_or_path}"))?;
    Ok(profile)
}

/// Fails if a list flag names one entry twice.
///
/// # Errors
/// A verdict over no committed transaction is no verdict: `Err` naming `what` when
/// `committed` is 0, with `hint` saying what to change.
///
/// # Errors
/// When nothing committed.
pub fn committed_something(what: &str, committed: u64, hint: &str) -> anyhow::Result<()> {
    if committed == 0 {
        bail!(
            "{what} committed no transaction, so its checker and invariants judged nothing: {hint}"
        );
    }
    Ok(())
}

/// The first repeated entry.
pub fn no_duplicates<T: PartialEq + fmt::Debug>(flag: &str, items: &[T]) -> anyhow::Result<()> {
    for (i, item) in items.iter().enumerate() {
        if items[..i].contains(item) {
            bail!("--{flag} names {item:?} twice: give each entry once");
        }
    }
    Ok(())
}

/// `key: count` pairs, most frequent first (ties by key), comma-separated: aborts by
/// reason, transactions given up by error.
#[must_use]
pub fn by_count(counts: &std::collections::BTreeMap<String, u64>) -> String {
    let mut c: Vec<(&String, &u64)> = counts.iter().collect();
    c.sort_by(|a, b| b.1.cmp(a.1));
    c.iter()
        .map(|(k, v)| format!("{k}: {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Rounds `x` to `digits` decimals (what a row's measurement supports).
#[must_use]
pub fn round(x: f64, digits: i32) -> f64 {
    if !x.is_finite() {
        return x;
    }
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

/// A progress bar on stderr over `len` steps, hidden with `--json` or when stderr is not a
/// terminal.
#[must_use]
pub fn progress(len: u64, prefix: &str, unit: &str, json: bool) -> indicatif::ProgressBar {
    if json || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{{prefix:>12}} [{{bar:30}}] {{pos}}/{{len}} {unit}  {{elapsed}}"
        ))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_prefix(prefix.to_string());
    bar
}

/// A table in dmem's style: no borders, a header row, numbers right-aligned.
#[must_use]
pub fn table(header: &[&str]) -> comfy_table::Table {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::NOTHING);
    t.set_content_arrangement(comfy_table::ContentArrangement::Disabled);
    t.set_header(header.iter().map(|h| comfy_table::Cell::new(*h)));
    for i in 0..header.len() {
        if let Some(c) = t.column_mut(i) {
            c.set_padding((0, 2));
            if i > 0 {
                c.set_cell_alignment(comfy_table::CellAlignment::Right);
            }
        }
    }
    t
}

/// A table as text, without trailing blanks.
#[must_use]
pub fn render(t: &comfy_table::Table) -> String {
    t.lines()
        .map(|l| l.trim_end().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Where a measuring command's rows go: a table (printed by the command), JSON lines on
/// stdout (one object per row as it is measured, then one summary object), and a CSV file.
pub struct Sink {
    json: bool,
    csv: Option<PathBuf>,
    /// The CSV file's columns, when fixed ([`Sink::with_columns`]).
    columns: Option<&'static [&'static str]>,
    rows: Vec<Value>,
}

impl Sink {
    /// A sink for `--json` and `--csv FILE`.
    ///
    /// # Errors
    /// The CSV file cannot be created (checked before any work).
    pub fn new(json: bool, csv: Option<&Path>) -> anyhow::Result<Self> {
        if let Some(path) = csv {
            std::fs::File::create(path)
                .with_context(|| format!("cannot create --csv file {}", path.display()))?;
        }
        Ok(Self {
            json,
            csv: csv.map(Path::to_path_buf),
            columns: None,
            rows: Vec::new(),
        })
    }

    /// The CSV file with exactly `columns`, whatever the rows hold ([`write_csv_columns`]):
    /// the same header on every run of a command, so that one reader reads them all.
    #[must_use]
    pub fn with_columns(mut self, columns: &'static [&'static str]) -> Self {
        self.columns = Some(columns);
        self
    }

    /// Whether rows go to stdout as JSON lines.
    #[must_use]
    pub fn json(&self) -> bool {
        self.json
    }

    /// Records one row (printed at once with `--json`).
    ///
    /// # Errors
    /// The row cannot be serialized.
    pub fn row(&mut self, row: &impl Serialize) -> anyhow::Result<()> {
        let value = serde_json::to_value(row)?;
        if self.json {
            println!("{}", serde_json::to_string(&value)?);
        }
        self.rows.push(value);
        Ok(())
    }

    /// Ends the output: the summary object with `--json` (`"summary": true`, the command,
    /// its full configuration, the number of rows and `extra`'s fields) and the CSV file.
    ///
    /// # Errors
    /// The CSV file cannot be written.
    pub fn finish(
        self,
        command: &str,
        config: &impl Serialize,
        extra: Value,
    ) -> anyhow::Result<()> {
        if self.json {
            let mut summary = serde_json::Map::new();
            summary.insert("summary".into(), Value::Bool(true));
            summary.insert("command".into(), Value::String(command.into()));
            summary.insert("config".into(), serde_json::to_value(config)?);
            summary.insert("rows".into(), Value::from(self.rows.len()));
            if let Value::Object(map) = extra {
                summary.extend(map);
            }
            println!("{}", Value::Object(summary));
        }
        if let Some(path) = &self.csv {
            match self.columns {
                Some(columns) => write_csv_columns(path, columns, &self.rows),
                None => write_csv(path, &self.rows),
            }
            .with_context(|| format!("cannot write --csv file {}", path.display()))?;
        }
        Ok(())
    }
}

/// Flattens a JSON object into `(column, cell)` pairs: nested objects as `outer.inner`.
fn flatten(prefix: &str, value: &Value, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        Value::Null => out.push((prefix.to_string(), String::new())),
        Value::String(s) => out.push((prefix.to_string(), s.clone())),
        other => out.push((prefix.to_string(), other.to_string())),
    }
}

/// Writes rows (JSON objects) as CSV: the columns are the union of the rows' fields in
/// first-seen order.
///
/// # Errors
/// The file cannot be written.
pub fn write_csv(path: &Path, rows: &[Value]) -> anyhow::Result<()> {
    let flat: Vec<Vec<(String, String)>> = rows
        .iter()
        .map(|r| {
            let mut cells = Vec::new();
            flatten("", r, &mut cells);
            cells
        })
        .collect();
    let mut columns: Vec<String> = Vec::new();
    for row in &flat {
        for (k, _) in row {
            if !columns.contains(k) {
                columns.push(k.clone());
            }
        }
    }
    let mut w = csv::Writer::from_path(path)?;
    w.write_record(&columns)?;
    for row in &flat {
        w.write_record(columns.iter().map(|c| {
            row.iter()
                .find(|(k, _)| k == c)
                .map_or("", |(_, v)| v.as_str())
        }))?;
    }
    w.flush()?;
    Ok(())
}

/// Writes rows (JSON objects) as CSV with exactly `columns`: each cell the row's field of
/// that name, a string as it is, a number or boolean as JSON, an object or array as one
/// cell of compact JSON, a missing or `null` field empty.
///
/// # Errors
/// The file cannot be written.
pub fn write_csv_columns(path: &Path, columns: &[&str], rows: &[Value]) -> anyhow::Result<()> {
    let mut w = csv::Writer::from_path(path)?;
    w.write_record(columns)?;
    for row in rows {
        w.write_record(columns.iter().map(|c| match row.get(*c) {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
        }))?;
    }
    w.flush()?;
    Ok(())
}

/// Ends the program quietly when stdout is closed (`dmem ... | head`): writing to a closed
/// pipe then ends the process as for any Unix filter, instead of a panic in `println!`.
pub fn quiet_on_closed_stdout() {
    // SAFETY: `signal` with SIG_DFL changes only the disposition of SIGPIPE, before any
    // other thread exists; no handler code runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

//! `dmem reproduce <paper> [--out DIR]`: a paper's key figures on the simulated cluster, next
//! to the paper's own values.
//!
//! Table-driven: each paper is one module with a [`Paper`] entry in [`PAPERS`]; its `run`
//! measures [`Figure`]s (written as CSV and SVG under `--out`) and [`Claim`]s: the paper's
//! value, dmem's, their ratio, whether dmem's is within ±30 % of the paper's (and if not,
//! the measured reason, or "not yet explained"), and whether the ordering the paper reports
//! holds here. A checked claim's ordering is a [`Rule`], a pure function of the measured
//! numbers that can fail (each paper's unit test feeds every rule numbers that pass and
//! numbers that fail); what holds by construction or cannot be measured here is
//! informational and not counted. Each paper ends with a [`Summary`]. The command exits 3
//! when a checked ordering does not hold.

mod dandelion;
mod declock;
mod lotus;
mod oocc;
mod pandora;

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Args as ClapArgs, ValueEnum};
use dmem_cli::common::{self, CheckFailed, Sink, round};
use plotters::prelude::*;
use serde::Serialize;

/// A figure: one x axis, several named series.
#[derive(Debug, Clone)]
pub(crate) struct Figure {
    /// File stem and id, e.g. `fig12_clients`.
    pub(crate) id: &'static str,
    pub(crate) title: String,
    pub(crate) x_label: &'static str,
    pub(crate) y_label: &'static str,
    /// Plot x on a log10 axis.
    pub(crate) log_x: bool,
    pub(crate) x: Vec<f64>,
    pub(crate) series: Vec<(String, Vec<f64>)>,
}

/// How a checked claim's ordering is judged: a pure function of the measured numbers it is
/// given (see [`Rule::holds`]), so a unit test can feed it numbers that pass and numbers that
/// fail. Empty or non-finite inputs never hold.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) enum Rule {
    /// `x[0] > x[1]`.
    Greater,
    /// `x[0] < x[1]`.
    Less,
    /// `x[0] / x[1] > t`.
    RatioAbove(f64),
    /// `x[0] / x[1] >= t`.
    RatioAtLeast(f64),
    /// Every `x` above `t`.
    AllAbove(f64),
    /// Every `x` at least `t`.
    AllAtLeast(f64),
    /// The lowest `x` at most `t`.
    MinAtMost(f64),
    /// Every `x` above the one before.
    Increasing,
    /// Every `x` at most the one before.
    NonIncreasing,
    /// A curve over doublings that stops growing: the first step (`x[1] / x[0]`) gains more
    /// than `first` and the last (`x[n-1] / x[n-2]`) less than `last` (fractions).
    Flattens { first: f64, last: f64 },
}

impl Rule {
    /// Whether the ordering holds for `x`.
    pub(crate) fn holds(self, x: &[f64]) -> bool {
        if x.is_empty() || x.iter().any(|v| !v.is_finite()) {
            return false;
        }
        let two = |f: &dyn Fn(f64, f64) -> bool| x.len() == 2 && f(x[0], x[1]);
        match self {
            Rule::Greater => two(&|a, b| a > b),
            Rule::Less => two(&|a, b| a < b),
            Rule::RatioAbove(t) => two(&|a, b| b > 0.0 && a / b > t),
            Rule::RatioAtLeast(t) => two(&|a, b| b > 0.0 && a / b >= t),
            Rule::AllAbove(t) => x.iter().all(|&v| v > t),
            Rule::AllAtLeast(t) => x.iter().all(|&v| v >= t),
            Rule::MinAtMost(t) => x.iter().copied().fold(f64::INFINITY, f64::min) <= t,
            Rule::Increasing => x.len() >= 2 && x.windows(2).all(|w| w[1] > w[0]),
            Rule::NonIncreasing => x.len() >= 2 && x.windows(2).all(|w| w[1] <= w[0]),
            Rule::Flattens { first, last } => {
                let n = x.len();
                n >= 3
                    && x[0] > 0.0
                    && x[n - 2] > 0.0
                    && x[1] / x[0] - 1.0 > first
                    && x[n - 1] / x[n - 2] - 1.0 < last
            }
        }
    }
}

/// How far dmem's value may be from the paper's and still count as the paper's magnitude.
pub(crate) const MAGNITUDE_TOLERANCE: f64 = 0.30;

/// A value or ordering the paper reports, against dmem's.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Claim {
    pub(crate) figure: &'static str,
    pub(crate) what: String,
    /// The paper's number (NaN: the paper gives none, or none dmem can compare).
    pub(crate) paper: f64,
    pub(crate) dmem: f64,
    /// The ordering the paper reports, in words.
    pub(crate) ordering: String,
    /// Whether the ordering is judged (and counted); false: informational.
    pub(crate) checked: bool,
    /// The checked ordering's rule and the numbers it judged.
    #[serde(serialize_with = "rule_text")]
    pub(crate) rule: Option<Rule>,
    pub(crate) inputs: Vec<f64>,
    /// Whether the ordering holds; `None` when informational.
    pub(crate) holds: Option<bool>,
    /// Why an informational claim is not judged (it holds by construction, or dmem cannot
    /// measure it).
    pub(crate) informational: Option<&'static str>,
    /// `|dmem - paper| <= 30 % of paper`; `None` when the paper gives no number.
    pub(crate) within_30pct: Option<bool>,
    /// Why dmem's value is outside ±30 % of the paper's (a measured model gap, a setup or
    /// scale difference), or "not yet explained"; `None` when within or not given.
    pub(crate) miss_reason: Option<&'static str>,
}

/// A rule as one CSV cell, e.g. `RatioAbove(1.05)`.
fn rule_text<S: serde::Serializer>(rule: &Option<Rule>, s: S) -> Result<S::Ok, S::Error> {
    match rule {
        Some(r) => s.serialize_str(&format!("{r:?}")),
        None => s.serialize_none(),
    }
}

/// What a row outside ±30 % says when nobody has measured why.
pub(crate) const NOT_EXPLAINED: &str = "not yet explained";

impl Claim {
    /// A checked claim: `rule` judges `inputs`.
    pub(crate) fn checked(
        figure: &'static str,
        what: impl Into<String>,
        paper: f64,
        dmem: f64,
        ordering: impl Into<String>,
        rule: Rule,
        inputs: Vec<f64>,
    ) -> Self {
        let holds = rule.holds(&inputs);
        Self::row(figure, what.into(), paper, dmem, ordering.into()).with(|c| {
            c.checked = true;
            c.rule = Some(rule);
            c.inputs = inputs;
            c.holds = Some(holds);
        })
    }

    /// An informational claim, shown but not judged: `why` it is not.
    pub(crate) fn info(
        figure: &'static str,
        what: impl Into<String>,
        paper: f64,
        dmem: f64,
        ordering: impl Into<String>,
        why: &'static str,
    ) -> Self {
        Self::row(figure, what.into(), paper, dmem, ordering.into())
            .with(|c| c.informational = Some(why))
    }

    /// An informational claim whose value holds by construction (`why`, which starts
    /// "by construction"): neither an ordering nor a magnitude is counted, since dmem's value
    /// is not a measurement of fidelity.
    pub(crate) fn by_construction(
        figure: &'static str,
        what: impl Into<String>,
        paper: f64,
        dmem: f64,
        ordering: impl Into<String>,
        why: &'static str,
    ) -> Self {
        Self::info(figure, what, paper, dmem, ordering, why).with(|c| {
            c.within_30pct = None;
            c.miss_reason = None;
        })
    }

    fn row(figure: &'static str, what: String, paper: f64, dmem: f64, ordering: String) -> Self {
        let within = within_30pct(paper, dmem);
        Self {
            figure,
            what,
            paper,
            dmem,
            ordering,
            checked: false,
            rule: None,
            inputs: Vec::new(),
            holds: None,
            informational: None,
            within_30pct: within,
            miss_reason: (within == Some(false)).then_some(NOT_EXPLAINED),
        }
    }

    fn with(mut self, f: impl FnOnce(&mut Self)) -> Self {
        f(&mut self);
        self
    }

    /// The measured reason dmem's value is outside ±30 % of the paper's; kept only when it
    /// is outside.
    pub(crate) fn miss(mut self, reason: &'static str) -> Self {
        if self.within_30pct == Some(false) {
            self.miss_reason = Some(reason);
        }
        self
    }
}

/// Whether `dmem` is within ±30 % of `paper`; `None` when the paper gives no number.
pub(crate) fn within_30pct(paper: f64, dmem: f64) -> Option<bool> {
    paper.is_finite().then(|| {
        dmem.is_finite() && (dmem - paper).abs() <= MAGNITUDE_TOLERANCE * paper.abs() * (1.0 + 1e-9)
    })
}

/// A paper's counts: orderings held of those checked, magnitudes within 30 % of those the
/// paper gives, informational claims.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Summary {
    pub(crate) orderings_held: usize,
    pub(crate) orderings_checked: usize,
    pub(crate) magnitudes_within_30pct: usize,
    pub(crate) magnitudes_given: usize,
    pub(crate) informational: usize,
}

impl Summary {
    pub(crate) fn of(claims: &[Claim]) -> Self {
        let mut s = Self::default();
        for c in claims {
            match c.holds {
                Some(h) => {
                    s.orderings_checked += 1;
                    s.orderings_held += usize::from(h);
                }
                None => s.informational += 1,
            }
            if let Some(w) = c.within_30pct {
                s.magnitudes_given += 1;
                s.magnitudes_within_30pct += usize::from(w);
            }
        }
        s
    }
}

/// What a paper's run produced.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub(crate) figures: Vec<Figure>,
    pub(crate) claims: Vec<Claim>,
}

/// One paper.
pub(crate) struct Paper {
    pub(crate) name: &'static str,
    pub(crate) title: &'static str,
    pub(crate) run: fn(&indicatif::ProgressBar) -> anyhow::Result<Outcome>,
    /// Runs it makes (for the progress bar).
    pub(crate) steps: u64,
}

/// Every paper `dmem reproduce` knows; adding one is a module and a line here.
pub(crate) const PAPERS: &[Paper] = &[
    dandelion::PAPER,
    declock::PAPER,
    lotus::PAPER,
    oocc::PAPER,
    pandora::PAPER,
];

/// Papers by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum PaperArg {
    /// Dandelion (§7 against FaSST, Figs. 16–22: ablation, servers 3 → 10, load).
    Dandelion,
    /// DecLock (lock microbenchmark, Figs. 12–13): CASLock, DSLR+, ShiftLock, DecLock-TF/-PF.
    Declock,
    /// LOTUS (§2.2 Figs. 2–3: Motor and FORD against MN atomics, and without the CAS).
    Lotus,
    /// OOCC (Figs. 10–14: against OCC, DrTM, DSLR; technique ladder; lease, manager and
    /// offset sweeps).
    Oocc,
    /// Pandora (steady state vs FORD and lock logging; recovery latency; FORD's scan).
    Pandora,
}

impl PaperArg {
    fn name(self) -> &'static str {
        match self {
            PaperArg::Dandelion => "dandelion",
            PaperArg::Declock => "declock",
            PaperArg::Lotus => "lotus",
            PaperArg::Oocc => "oocc",
            PaperArg::Pandora => "pandora",
        }
    }
}

/// Arguments of `dmem reproduce`.
#[derive(Debug, ClapArgs, Serialize)]
pub(crate) struct Args {
    /// The paper.
    #[arg(value_enum)]
    paper: PaperArg,
    /// Where CSV and SVG files go (default `./reproduce/<paper>/`).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Print JSON lines instead of the table: one object per claim, then a summary.
    #[arg(long)]
    json: bool,
    /// Also write the claims to this CSV file (they are always in DIR/claims.csv).
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
}

/// Runs `dmem reproduce`.
pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let paper = PAPERS
        .iter()
        .find(|p| p.name == args.paper.name())
        .context("paper not in the table")?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| Path::new("reproduce").join(paper.name));
    std::fs::create_dir_all(&out)
        .with_context(|| format!("cannot create --out folder {}", out.display()))?;
    let mut sink = Sink::new(args.json, args.csv.as_deref())?;
    let started = std::time::Instant::now();
    let bar = common::progress(paper.steps, paper.name, "runs", args.json);
    let outcome = (paper.run)(&bar)?;
    bar.finish_and_clear();
    let mut files = Vec::new();
    for fig in &outcome.figures {
        let csv = out.join(format!("{}.csv", fig.id));
        write_figure_csv(&csv, fig).with_context(|| format!("writing {}", csv.display()))?;
        let svg = out.join(format!("{}.svg", fig.id));
        plot(&svg, fig).map_err(|e| anyhow::anyhow!("drawing {}: {e}", svg.display()))?;
        files.push(csv.display().to_string());
        files.push(svg.display().to_string());
    }
    let claims_csv = out.join("claims.csv");
    let claim_rows: Vec<serde_json::Value> = outcome
        .claims
        .iter()
        .map(|c| {
            let mut v = serde_json::to_value(c)?;
            v["ratio"] = serde_json::json!(round(ratio(c), 3));
            v["paper_name"] = serde_json::json!(paper.name);
            Ok(v)
        })
        .collect::<anyhow::Result<_>>()?;
    common::write_csv(&claims_csv, &claim_rows)?;
    files.push(claims_csv.display().to_string());
    for row in &claim_rows {
        sink.row(row)?;
    }
    let summary = Summary::of(&outcome.claims);
    if !args.json {
        println!(
            "dmem reproduce {}  ({})  simulated cluster, {:.0} s",
            paper.name,
            paper.title,
            started.elapsed().as_secs_f64()
        );
        println!("{}", common::render(&claims_table(&outcome.claims)));
        let misses: Vec<&Claim> = outcome
            .claims
            .iter()
            .filter(|c| c.within_30pct == Some(false))
            .collect();
        if !misses.is_empty() {
            println!("outside ±30 % of the paper, and why:");
            for c in misses {
                println!(
                    "  {} {}: {}",
                    c.figure,
                    c.what,
                    c.miss_reason.unwrap_or(NOT_EXPLAINED)
                );
            }
        }
        let info: Vec<&Claim> = outcome.claims.iter().filter(|c| !c.checked).collect();
        if !info.is_empty() {
            println!("informational (not counted as orderings), and why:");
            for c in info {
                println!(
                    "  {} {}: {}",
                    c.figure,
                    c.what,
                    c.informational.unwrap_or("-")
                );
            }
        }
        println!(
            "summary: orderings held {}/{} checked, magnitudes within 30 % {}/{} given, {} informational",
            summary.orderings_held,
            summary.orderings_checked,
            summary.magnitudes_within_30pct,
            summary.magnitudes_given,
            summary.informational
        );
        println!("wrote {}", files.join(", "));
    }
    let failed: Vec<String> = outcome
        .claims
        .iter()
        .filter(|c| c.holds == Some(false))
        .map(|c| format!("{} ({})", c.ordering, c.figure))
        .collect();
    sink.finish(
        "reproduce",
        &args,
        serde_json::json!({
            "out": out.display().to_string(),
            "files": files,
            "orderings_failed": failed,
            "counts": summary,
            "wall_s": round(started.elapsed().as_secs_f64(), 1),
        }),
    )?;
    if !failed.is_empty() {
        return Err(CheckFailed(format!(
            "{} of the paper's orderings do not hold here: {}",
            failed.len(),
            failed.join("; ")
        ))
        .into());
    }
    Ok(())
}

/// The claims as a table: one row each, `holds` is `info` for an informational claim.
fn claims_table(claims: &[Claim]) -> comfy_table::Table {
    let yes_no = |b: Option<bool>, no: &str| match b {
        Some(true) => "yes".to_string(),
        Some(false) => no.to_string(),
        None => "-".to_string(),
    };
    let mut t = common::table(&[
        "figure",
        "what",
        "paper",
        "dmem",
        "dmem/paper",
        "±30%",
        "ordering (paper)",
        "holds",
    ]);
    for c in claims {
        t.add_row(vec![
            c.figure.to_string(),
            c.what.clone(),
            fmt(c.paper),
            fmt(c.dmem),
            fmt(ratio(c)),
            yes_no(c.within_30pct, "no"),
            c.ordering.clone(),
            if c.checked {
                yes_no(c.holds, "NO")
            } else {
                "info".to_string()
            },
        ]);
    }
    for col in [1, 6] {
        if let Some(c) = t.column_mut(col) {
            c.set_cell_alignment(comfy_table::CellAlignment::Left);
        }
    }
    t
}

fn ratio(c: &Claim) -> f64 {
    if c.paper == 0.0 {
        f64::NAN
    } else {
        c.dmem / c.paper
    }
}

fn fmt(x: f64) -> String {
    if !x.is_finite() {
        "-".to_string()
    } else if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

fn write_figure_csv(path: &Path, fig: &Figure) -> anyhow::Result<()> {
    let mut w = csv::Writer::from_path(path)?;
    let mut header = vec![fig.x_label.to_string()];
    header.extend(fig.series.iter().map(|(n, _)| n.clone()));
    w.write_record(&header)?;
    for (i, x) in fig.x.iter().enumerate() {
        let mut rec = vec![x.to_string()];
        rec.extend(fig.series.iter().map(|(_, ys)| {
            ys.get(i)
                .map_or(String::new(), |y| round(*y, 4).to_string())
        }));
        w.write_record(&rec)?;
    }
    w.flush()?;
    Ok(())
}

/// A tick label: the value itself (36, 72, 144, 0.5), never an exponent.
fn tick(x: f64) -> String {
    let r = (x * 1e3).round() / 1e3;
    if (r - r.round()).abs() < 1e-9 {
        format!("{}", r.round())
    } else {
        format!("{r}")
    }
}

/// An x axis with a tick at each measured x; on a log axis the coordinates are log10 of
/// the values and the labels the values themselves.
struct TickAxis {
    inner: plotters::coord::types::RangedCoordf64,
    ticks: Vec<f64>,
    log: bool,
}

impl plotters::coord::ranged1d::Ranged for TickAxis {
    type FormatOption = plotters::coord::ranged1d::NoDefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<Hint: plotters::coord::ranged1d::KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.inner.range()
    }
}

impl plotters::coord::ranged1d::ValueFormatter<f64> for TickAxis {
    fn format_ext(&self, value: &f64) -> String {
        tick(if self.log { 10f64.powf(*value) } else { *value })
    }
}

/// One SVG line plot of a figure. The x axis has a tick at every measured x, labelled with
/// its value; a log axis is drawn in log10 space but labelled with the real values.
fn plot(path: &Path, fig: &Figure) -> Result<(), Box<dyn std::error::Error>> {
    let to_axis = |x: f64| if fig.log_x { x.max(1e-9).log10() } else { x };
    let xs: Vec<f64> = fig.x.iter().map(|&x| to_axis(x)).collect();
    let (x0, x1) = xs
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
    let pad = ((x1 - x0) * 0.05).max(1e-6);
    let y1 = fig
        .series
        .iter()
        .flat_map(|(_, ys)| ys.iter().copied())
        .filter(|y| y.is_finite())
        .fold(0f64, f64::max)
        * 1.5;
    let root = SVGBackend::new(path, (760, 460)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&fig.title, ("sans-serif", 18))
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(
            TickAxis {
                inner: ((x0 - pad)..(x1 + pad)).into(),
                ticks: xs.clone(),
                log: fig.log_x,
            },
            0f64..y1.max(1e-9),
        )?;
    let x_desc = if fig.log_x {
        format!("{} (log scale)", fig.x_label)
    } else {
        fig.x_label.to_string()
    };
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(fig.y_label)
        .draw()?;
    for (i, (name, ys)) in fig.series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points: Vec<(f64, f64)> = xs
            .iter()
            .copied()
            .zip(ys.iter().copied())
            .filter(|(_, y)| y.is_finite())
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 3, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.85))
        .draw()?;
    root.present()?;
    Ok(())
}

/// A number out of a JSON row.
pub(crate) fn num(row: &serde_json::Value, field: &str) -> anyhow::Result<f64> {
    row[field]
        .as_f64()
        .with_context(|| format!("no number `{field}` in {row}"))
}

/// `dmem recover`'s committed transactions per ms (`series`) of a report.
pub(crate) fn per_ms(report: &serde_json::Value) -> anyhow::Result<Vec<f64>> {
    report["series"]
        .as_array()
        .with_context(|| format!("no `series` in {report}"))?
        .iter()
        .map(|v| v.as_f64().context("a number in `series`"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_never_hold_on_missing_or_non_finite_numbers() {
        for rule in [
            Rule::Greater,
            Rule::Less,
            Rule::RatioAbove(1.0),
            Rule::RatioAtLeast(0.95),
            Rule::AllAbove(0.0),
            Rule::AllAtLeast(1.0),
            Rule::MinAtMost(0.0),
            Rule::Increasing,
            Rule::NonIncreasing,
            Rule::Flattens {
                first: 0.2,
                last: 0.1,
            },
        ] {
            assert!(!rule.holds(&[]), "{rule:?} holds for nothing");
            assert!(!rule.holds(&[f64::NAN, 1.0, 1.0]), "{rule:?} holds for NaN");
        }
        // A two-number rule given three numbers is not judged on the first two.
        assert!(!Rule::Greater.holds(&[2.0, 1.0, 0.0]));
        assert!(!Rule::RatioAbove(1.0).holds(&[1.0, 0.0]));
    }

    #[test]
    fn magnitude_is_within_30pct_of_the_paper_or_not_given() {
        assert_eq!(within_30pct(2.0, 1.4), Some(true));
        assert_eq!(within_30pct(2.0, 1.39), Some(false));
        assert_eq!(within_30pct(2.0, 2.6), Some(true));
        assert_eq!(within_30pct(0.0, 0.0), Some(true));
        assert_eq!(within_30pct(0.0, 0.1), Some(false));
        assert_eq!(within_30pct(f64::NAN, 3.0), None);
        assert_eq!(within_30pct(2.0, f64::INFINITY), Some(false));
    }

    #[test]
    fn informational_claims_are_not_counted_and_misses_carry_a_reason() {
        let claims = [
            Claim::checked("f", "a", 2.0, 2.1, "a > b", Rule::Greater, vec![2.1, 1.0]),
            Claim::checked("f", "b", 2.0, 0.5, "a > b", Rule::Greater, vec![0.5, 1.0])
                .miss("model: measured"),
            Claim::checked(
                "f",
                "c",
                f64::NAN,
                1.0,
                "a > b",
                Rule::Greater,
                vec![1.0, 1.0],
            ),
            Claim::info("f", "d", 1.0, 5.0, "same", "tiny scale"),
            Claim::by_construction("f", "e", 1.0, 1.0, "same", "by construction: x"),
        ];
        assert_eq!(
            Summary::of(&claims),
            Summary {
                orderings_held: 1,
                orderings_checked: 3,
                magnitudes_within_30pct: 1,
                magnitudes_given: 3,
                informational: 2,
            }
        );
        assert_eq!(claims[0].miss_reason, None);
        assert_eq!(claims[1].miss_reason, Some("model: measured"));
        assert_eq!(claims[2].miss_reason, None);
        // Outside ±30 % with no reason given: said so.
        assert_eq!(claims[3].miss_reason, Some(NOT_EXPLAINED));
        assert_eq!(claims[3].holds, None);
        assert_eq!((claims[4].within_30pct, claims[4].holds), (None, None));
        // A reason for a row within ±30 % is dropped.
        let within = Claim::info("f", "e", 1.0, 1.1, "same", "x").miss("model: y");
        assert_eq!(within.miss_reason, None);
    }

    #[test]
    fn ticks_are_the_values_not_exponents() {
        assert_eq!(tick(10f64.powf(72f64.log10())), "72");
        assert_eq!(tick(10f64.powf(1e6f64.log10())), "1000000");
        assert_eq!(tick(0.5), "0.5");
    }

    #[test]
    fn a_log_axis_plot_labels_the_measured_values() {
        let dir = std::env::temp_dir().join(format!("dmem-reproduce-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("fig.svg");
        let fig = Figure {
            id: "fig",
            title: "t".into(),
            x_label: "concurrent transactions",
            y_label: "Mtps",
            log_x: true,
            x: vec![36.0, 72.0, 144.0, 288.0, 576.0],
            series: vec![("a".into(), vec![1.0, 2.0, 3.0, 3.0, 2.5])],
        };
        plot(&path, &fig).unwrap();
        let svg: String = std::fs::read_to_string(&path)
            .unwrap()
            .split_whitespace()
            .collect();
        for label in [">36<", ">72<", ">144<", ">288<", ">576<"] {
            assert!(svg.contains(label), "no tick {label}");
        }
        assert!(!svg.contains("log10"), "an exponent axis");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! `dmem reproduce <paper> [--out DIR]`: a paper's key figures on the simulated cluster, next
//! to the paper's own values.
//!
//! Table-driven: each paper is one module with a [`Paper`] entry in [`PAPERS`]; its `run`
//! measures [`Figure`]s (written as CSV and SVG under `--out`) and [`Claim`]s (the paper's
//! value, dmem's, their ratio, and whether the ordering the paper reports holds here). The
//! command exits 3 when an ordering does not hold.

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

/// A value or ordering the paper reports, against dmem's.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Claim {
    pub(crate) figure: &'static str,
    pub(crate) what: String,
    pub(crate) paper: f64,
    pub(crate) dmem: f64,
    /// The ordering the paper reports, in words.
    pub(crate) ordering: String,
    pub(crate) holds: bool,
}

impl Claim {
    pub(crate) fn new(
        figure: &'static str,
        what: impl Into<String>,
        paper: f64,
        dmem: f64,
        ordering: impl Into<String>,
        holds: bool,
    ) -> Self {
        Self {
            figure,
            what: what.into(),
            paper,
            dmem,
            ordering: ordering.into(),
            holds,
        }
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
    if !args.json {
        println!(
            "dmem reproduce {}  ({})  simulated cluster, {:.0} s",
            paper.name,
            paper.title,
            started.elapsed().as_secs_f64()
        );
        let mut t = common::table(&[
            "figure",
            "what",
            "paper",
            "dmem",
            "dmem/paper",
            "ordering (paper)",
            "holds",
        ]);
        for c in &outcome.claims {
            t.add_row(vec![
                c.figure.to_string(),
                c.what.clone(),
                fmt(c.paper),
                fmt(c.dmem),
                fmt(ratio(c)),
                c.ordering.clone(),
                if c.holds { "yes" } else { "NO" }.to_string(),
            ]);
        }
        for col in [1, 5] {
            if let Some(c) = t.column_mut(col) {
                c.set_cell_alignment(comfy_table::CellAlignment::Left);
            }
        }
        println!("{}", common::render(&t));
        println!("wrote {}", files.join(", "));
    }
    let failed: Vec<String> = outcome
        .claims
        .iter()
        .filter(|c| !c.holds)
        .map(|c| format!("{} ({})", c.ordering, c.figure))
        .collect();
    sink.finish(
        "reproduce",
        &args,
        serde_json::json!({
            "out": out.display().to_string(),
            "files": files,
            "orderings_failed": failed,
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

/// One SVG line plot of a figure.
fn plot(path: &Path, fig: &Figure) -> Result<(), Box<dyn std::error::Error>> {
    let xs: Vec<f64> = fig
        .x
        .iter()
        .map(|&x| if fig.log_x { x.max(1e-9).log10() } else { x })
        .collect();
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
        .build_cartesian_2d((x0 - pad)..(x1 + pad), 0f64..y1.max(1e-9))?;
    let x_desc = if fig.log_x {
        format!("{} (log10)", fig.x_label)
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

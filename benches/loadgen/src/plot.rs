//! `--plot FILE.svg|FILE.html`: throughput and latency percentiles over
//! time for every target of a run, from the per-interval samples of
//! [`crate::timeline`], drawn with plotters' SVG backend.
//!
//! Layout: a title (the workload), then two charts sharing the time axis
//! (seconds since the warm-up ended; the targets ran one after another,
//! each is drawn from its own start): checks/s, and latency p50 (solid),
//! p99 (dashed) and p99.9 (dotted) on a log scale, one colour per target.
//! `.html` puts the same SVG in a self-contained page with the command
//! line, the summary table and the ratios.
//!
//! Text is left to the viewer's fonts (plotters' font stack is not built),
//! so the SVG names every target and figure as text.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::coord::{CoordTranslate, Shift};
use plotters::element::DashedPathElement;
use plotters::prelude::*;

use crate::report::{self, Summary};
use crate::timeline::Sample;

const WIDTH: u32 = 1100;
const HEIGHT: u32 = 820;
/// One colour per target, in run order (then around again).
const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
];
const FONT: &str = "sans-serif";
/// Share of each chart's height kept free above the lines for the legend.
const LEGEND_ROOM: f64 = 0.4;

/// The two outputs `--plot` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Svg,
    Html,
}

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("--plot {}: the file name must end in .svg or .html", .0.display())]
    Extension(PathBuf),
    #[error("--plot: no target has samples to draw")]
    Empty,
    #[error("--plot: drawing failed: {0}")]
    Draw(String),
    #[error("--plot {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl Format {
    /// The format a file name asks for.
    pub fn of(path: &Path) -> Result<Self, PlotError> {
        match path.extension().and_then(|e| e.to_str()) {
            Some(e) if e.eq_ignore_ascii_case("svg") => Ok(Self::Svg),
            Some(e) if e.eq_ignore_ascii_case("html") || e.eq_ignore_ascii_case("htm") => {
                Ok(Self::Html)
            }
            _ => Err(PlotError::Extension(path.to_owned())),
        }
    }
}

fn draw_error(e: impl std::fmt::Display) -> PlotError {
    PlotError::Draw(e.to_string())
}

/// Writes the plot of `summaries` to `path` (`command`: the command line
/// of the run, shown by the HTML page).
pub fn write(path: &Path, summaries: &[Summary], command: &str) -> Result<(), PlotError> {
    let text = match Format::of(path)? {
        Format::Svg => svg(summaries)?,
        Format::Html => html(summaries, command)?,
    };
    std::fs::write(path, text).map_err(|source| PlotError::Write {
        path: path.to_owned(),
        source,
    })
}

/// A latency percentile drawn: its label, how to read it from a sample, and
/// its dash pattern (dash, gap in pixels; a zero gap is a solid line).
struct Percentile {
    name: &'static str,
    of: fn(&Sample) -> Option<f64>,
    dash: u32,
    gap: u32,
}

const PERCENTILES: [Percentile; 3] = [
    Percentile {
        name: "p50",
        of: |s| s.p50_us,
        dash: 1,
        gap: 0,
    },
    Percentile {
        name: "p99",
        of: |s| s.p99_us,
        dash: 8,
        gap: 5,
    },
    Percentile {
        name: "p99.9",
        of: |s| s.p999_us,
        dash: 2,
        gap: 4,
    },
];

/// The SVG document.
pub fn svg(summaries: &[Summary]) -> Result<String, PlotError> {
    let plotted: Vec<&Summary> = summaries.iter().filter(|s| !s.samples.is_empty()).collect();
    if plotted.is_empty() {
        return Err(PlotError::Empty);
    }
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_error)?;
        let title = format!(
            "tollgate-bench: {}",
            report::describe_workload(&plotted[0].workload)
        );
        let body = root
            .titled(&title, (FONT, 14).into_font())
            .map_err(draw_error)?;
        let (upper, lower) = body.split_vertically(HEIGHT * 9 / 20);
        throughput(&upper, &plotted)?;
        latency(&lower, &plotted)?;
        root.present().map_err(draw_error)?;
    }
    Ok(out)
}

fn time_range(plotted: &[&Summary]) -> std::ops::Range<f64> {
    let end = plotted
        .iter()
        .flat_map(|s| s.samples.iter().map(|p| p.at_s))
        .fold(0.0, f64::max);
    0.0..end.max(f64::EPSILON)
}

fn throughput(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    plotted: &[&Summary],
) -> Result<(), PlotError> {
    let top = plotted
        .iter()
        .flat_map(|s| s.samples.iter().map(|p| p.checks_per_sec))
        .fold(0.0, f64::max)
        .max(1.0)
        / (1.0 - LEGEND_ROOM);
    let mut chart = ChartBuilder::on(area)
        .caption("Throughput (decided checks per second)", (FONT, 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(90)
        .build_cartesian_2d(time_range(plotted), 0.0..top)
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the warm-up")
        .y_desc("checks/s")
        .y_label_formatter(&|v| report::grouped(*v))
        .draw()
        .map_err(draw_error)?;
    for (i, s) in plotted.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let points = s.samples.iter().map(|p| (p.at_s, p.checks_per_sec));
        chart
            .draw_series(LineSeries::new(points, colour.stroke_width(2)))
            .map_err(draw_error)?
            .label(format!(
                "{} {}: {} checks/s",
                s.target,
                s.addr,
                report::grouped(s.ops_per_sec)
            ))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], colour.stroke_width(2)));
    }
    legend(&mut chart, 13)
}

fn latency(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    plotted: &[&Summary],
) -> Result<(), PlotError> {
    let values = || {
        plotted.iter().flat_map(|s| {
            s.samples
                .iter()
                .flat_map(|p| PERCENTILES.iter().filter_map(move |q| (q.of)(p)))
        })
    };
    let low = values().fold(f64::INFINITY, f64::min);
    let high = values().fold(0.0, f64::max);
    let (low, high) = if low.is_finite() && high > 0.0 {
        ((low / 1.5).max(0.1), high * 1.5)
    } else {
        (1.0, 10.0)
    };
    // The same room above the lines on the log scale.
    let high = low * ((high / low).ln() / (1.0 - LEGEND_ROOM)).exp();
    let mut chart = ChartBuilder::on(area)
        .caption(
            "Latency per request: p50 (solid), p99 (dashed), p99.9 (dotted)",
            (FONT, 16),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(90)
        .build_cartesian_2d(time_range(plotted), (low..high).log_scale())
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the warm-up")
        .y_desc("µs (log scale)")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(draw_error)?;
    for (i, s) in plotted.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        for Percentile {
            name,
            of,
            dash,
            gap,
        } in PERCENTILES
        {
            let points: Vec<(f64, f64)> = s
                .samples
                .iter()
                .filter_map(|p| Some((p.at_s, of(p)?)))
                .collect();
            let style = colour.stroke_width(2);
            let label = format!("{} {name}", s.target);
            if gap == 0 {
                chart
                    .draw_series(LineSeries::new(points, style))
                    .map_err(draw_error)?
                    .label(label)
                    .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], style));
            } else {
                chart
                    .draw_series(DashedLineSeries::new(points, dash, gap, style))
                    .map_err(draw_error)?
                    .label(label)
                    .legend(move |(x, y)| {
                        DashedPathElement::new([(x, y), (x + 24, y)], dash, gap, style)
                    });
            }
        }
    }
    legend(&mut chart, 12)
}

/// The series' labels, in the room kept free at the top right.
fn legend<'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, CT>,
    font_size: u32,
) -> Result<(), PlotError> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, font_size))
        .draw()
        .map_err(draw_error)
}

/// `&`, `<`, `>` and `"` as entities.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

/// A self-contained page: the command, the SVG, the table and the ratios.
pub fn html(summaries: &[Summary], command: &str) -> Result<String, PlotError> {
    let svg = svg(summaries)?;
    let workload = report::describe_workload(&summaries[0].workload);
    let mut page = String::new();
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>tollgate-bench: {title}</title>\n<style>\n\
         body {{ font-family: sans-serif; margin: 2em; }}\n\
         table {{ border-collapse: collapse; margin: 1em 0; }}\n\
         th, td {{ padding: 0.2em 0.8em; border-bottom: 1px solid #ccc; text-align: right; }}\n\
         th:first-child, td:first-child {{ text-align: left; }}\n\
         pre {{ background: #f4f4f4; padding: 0.6em; white-space: pre-wrap; }}\n\
         </style>\n</head>\n<body>\n<h1>tollgate-bench</h1>\n<p>{workload}</p>\n\
         <pre><code>{command}</code></pre>\n",
        title = escape(
            &summaries
                .iter()
                .map(|s| s.target)
                .collect::<Vec<_>>()
                .join(" vs ")
        ),
        workload = escape(&workload),
        command = escape(command),
    );
    page.push_str(&svg);
    page.push_str(
        "\n<table>\n<tr><th>target</th><th>addr</th><th>checks/s</th><th>p50 µs</th>\
         <th>p99 µs</th><th>p99.9 µs</th><th>errors</th></tr>\n",
    );
    for s in summaries {
        let _ = writeln!(
            page,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{:.1}</td>\
             <td>{:.1}</td><td>{}</td></tr>",
            escape(s.target),
            escape(&s.addr),
            report::grouped(s.ops_per_sec),
            s.p50_us,
            s.p99_us,
            s.p999_us,
            s.errors
        );
    }
    page.push_str("</table>\n");
    for line in report::ratios(summaries).lines() {
        let _ = writeln!(page, "<p>{}</p>", escape(line));
    }
    page.push_str("</body>\n</html>\n");
    Ok(page)
}

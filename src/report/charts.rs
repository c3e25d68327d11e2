//! SVG charts of `fjord report`, drawn with `plotters`' SVG backend (no fonts,
//! browser or JavaScript needed to view them).
//!
//! Percentile curves put the percentile on a log scale of "nines":
//! x = −log10(1 − p/100), so p50 is at 0.30, p90 at 1, p99 at 2, p99.9 at 3
//! and p99.99 at 4 — the tail gets as much room as the median. Latency (y) is
//! on a log scale too. Single-threaded; every chart is one file.

use std::path::Path;

use plotters::prelude::*;

use super::{Group, ReportError};

/// One line of a chart: its group (colour, legend entry) and points.
type Line = (usize, Vec<(f64, f64)>);

/// Chart size in pixels (the page scales it to its width; text sizes are
/// for this size, so they stay readable at a typical 1200–1800 px page).
pub const CHART_WIDTH_PX: u32 = 1400;
pub const CHART_HEIGHT_PX: u32 = 600;
/// Width of the legend, right of the plot: a legend inside the plot sat on
/// top of the curves.
pub const LEGEND_WIDTH_PX: u32 = 340;
/// Room right of the plot for the last x label (p99.99 was cut off).
const PLOT_MARGIN_RIGHT_PX: u32 = 40;
/// Font sizes in pixels: title, axis numbers and descriptions, legend.
const TITLE_FONT_PX: u32 = 26;
const AXIS_FONT_PX: u32 = 17;
const LEGEND_FONT_PX: u32 = 17;
/// The percentile range of latency curves.
pub const CURVE_PERCENTILE_MIN: f64 = 50.0;
pub const CURVE_PERCENTILE_MAX: f64 = 99.99;
/// Smallest latency drawn on a log axis, in ms (zero cannot be).
const LATENCY_FLOOR_MS: f64 = 0.001;

/// One chart written to disk.
pub struct Figure {
    pub title: String,
    /// File name relative to the report directory.
    pub file: String,
}

fn nines(p: f64) -> f64 {
    -(1.0 - p / 100.0).max(1e-9).log10()
}

fn percentile_label(x: f64) -> String {
    let p = 100.0 * (1.0 - 10f64.powf(-x));
    let s = format!("{p:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("p{s}")
}

/// Axis numbers without float noise (0.30000000000000004).
fn axis_number(v: f64) -> String {
    let s = if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

fn color(i: usize) -> RGBColor {
    const PALETTE: [RGBColor; 6] = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
        RGBColor(255, 127, 14),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
    ];
    PALETTE[i % PALETTE.len()]
}

fn chart_err(name: &str) -> impl Fn(String) -> ReportError + '_ {
    move |reason| ReportError::Chart {
        name: name.to_string(),
        reason,
    }
}

/// Draws every chart for which at least one result has data: one line per
/// run, coloured by its group, one legend entry per group.
pub fn draw_all(groups: &[Group<'_>], dir: &Path) -> Result<Vec<Figure>, ReportError> {
    let names: Vec<String> = groups
        .iter()
        .map(|g| match g.runs.len() {
            1 => g.name.clone(),
            n => format!("{} ×{n} runs", g.name),
        })
        .collect();
    let runs: Vec<(usize, &super::Loaded)> = groups
        .iter()
        .enumerate()
        .flat_map(|(gi, g)| g.runs.iter().map(move |r| (gi, *r)))
        .collect();
    let mut figs = Vec::new();
    for (key, title, file) in [
        (
            "aggregatedPublishLatencyQuantiles",
            "Publish latency by percentile (ms)",
            "publish-latency-percentiles.svg",
        ),
        (
            "aggregatedEndToEndLatencyQuantiles",
            "End-to-end latency by percentile (ms)",
            "end-to-end-latency-percentiles.svg",
        ),
    ] {
        let curves: Vec<Line> = runs
            .iter()
            .map(|&(gi, r)| {
                let pts = r
                    .quantiles(key)
                    .into_iter()
                    .filter(|(p, _)| (CURVE_PERCENTILE_MIN..=CURVE_PERCENTILE_MAX).contains(p))
                    .map(|(p, v)| (nines(p), v.max(LATENCY_FLOOR_MS)))
                    .collect();
                (gi, pts)
            })
            .collect();
        if curves.iter().any(|(_, c)| !c.is_empty()) {
            percentile_chart(&dir.join(file), title, &curves, &names).map_err(chart_err(file))?;
            figs.push(Figure {
                title: title.to_string(),
                file: file.to_string(),
            });
        }
    }
    for (key, title, file, log_y, scale) in [
        (
            "publishRate",
            "Publish throughput over time (MB/s)",
            "throughput-over-time.svg",
            false,
            true,
        ),
        (
            "publishLatency99pct",
            "Publish latency p99 over time (ms)",
            "publish-p99-over-time.svg",
            true,
            false,
        ),
        (
            "endToEndLatency99pct",
            "End-to-end latency p99 over time (ms)",
            "end-to-end-p99-over-time.svg",
            true,
            false,
        ),
        (
            "consumeRate",
            "Consume throughput over time (MB/s)",
            "consume-throughput-over-time.svg",
            false,
            true,
        ),
    ] {
        let lines: Vec<Line> = runs
            .iter()
            .map(|&(gi, r)| {
                let t = r.series("elapsedSeconds");
                let v = r.series(key);
                let size = r.num("messageSize").unwrap_or(0.0);
                let pts = t
                    .iter()
                    .zip(v.iter())
                    .map(|(&t, &v)| {
                        let v = if scale {
                            v * size / (1024.0 * 1024.0)
                        } else {
                            v
                        };
                        (t, if log_y { v.max(LATENCY_FLOOR_MS) } else { v })
                    })
                    .collect();
                (gi, pts)
            })
            .collect();
        let has_data = lines
            .iter()
            .any(|(_, l)| l.iter().any(|&(_, v)| v > LATENCY_FLOOR_MS));
        if has_data {
            time_chart(&dir.join(file), title, &lines, &names, log_y).map_err(chart_err(file))?;
            figs.push(Figure {
                title: title.to_string(),
                file: file.to_string(),
            });
        }
    }
    Ok(figs)
}

fn bounds(lines: &[Line]) -> (f64, f64, f64, f64) {
    let pts = lines.iter().flat_map(|(_, l)| l.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        return (0.0, 1.0, LATENCY_FLOOR_MS, 1.0);
    }
    if x1 - x0 < 1e-9 {
        x1 = x0 + 1.0;
    }
    if y1 - y0 < 1e-9 {
        y1 = y0 * 2.0 + 1e-3;
    }
    (x0, x1, y0, y1)
}

/// Draws the legend (one entry per group name) in `area`, right of the plot.
fn legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    names: &[String],
) -> Result<(), String> {
    let row_px = LEGEND_FONT_PX as i32 + 12;
    for (i, name) in names.iter().enumerate() {
        let y = 60 + i as i32 * row_px;
        let c = color(i);
        area.draw(&PathElement::new(vec![(10, y), (40, y)], c.stroke_width(3)))
            .map_err(|e| e.to_string())?;
        area.draw(&Text::new(
            name.clone(),
            (48, y - LEGEND_FONT_PX as i32 / 2),
            ("sans-serif", LEGEND_FONT_PX),
        ))
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn percentile_chart(
    path: &Path,
    title: &str,
    curves: &[Line],
    names: &[String],
) -> Result<(), String> {
    let (_, _, y0, y1) = bounds(curves);
    let root = SVGBackend::new(path, (CHART_WIDTH_PX, CHART_HEIGHT_PX)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (plot, legend_area) = root.split_horizontally(CHART_WIDTH_PX - LEGEND_WIDTH_PX);
    legend(&legend_area, names)?;
    let mut chart = ChartBuilder::on(&plot)
        .caption(title, ("sans-serif", TITLE_FONT_PX))
        .margin(10)
        .margin_right(PLOT_MARGIN_RIGHT_PX)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(
            nines(CURVE_PERCENTILE_MIN)..nines(CURVE_PERCENTILE_MAX),
            ((y0 / 1.5).max(LATENCY_FLOOR_MS)..y1 * 1.5).log_scale(),
        )
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency (ms)")
        .label_style(("sans-serif", AXIS_FONT_PX))
        .axis_desc_style(("sans-serif", AXIS_FONT_PX))
        .x_labels(0)
        .y_labels(12)
        .y_label_formatter(&|y| axis_number(*y))
        .draw()
        .map_err(|e| e.to_string())?;
    // The mesh would put its ticks at round "nines" (p68.38, ...): label the
    // usual percentiles instead, each with a vertical guide.
    let y_bottom = (y0 / 1.5).max(LATENCY_FLOOR_MS);
    let y_top = y1 * 1.5;
    for p in [50.0, 75.0, 90.0, 95.0, 99.0, 99.9, 99.99] {
        let x = nines(p);
        chart
            .draw_series(LineSeries::new(
                [(x, y_bottom), (x, y_top)],
                BLACK.mix(0.25).stroke_width(1),
            ))
            .map_err(|e| e.to_string())?;
        let (px, py) = chart.backend_coord(&(x, y_bottom));
        root.draw(&Text::new(
            percentile_label(x),
            (px - 18, py + 6),
            ("sans-serif", AXIS_FONT_PX - 1),
        ))
        .map_err(|e| e.to_string())?;
    }
    for (group, pts) in curves {
        let c = color(*group);
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 2, c.filled())))
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}

fn time_chart(
    path: &Path,
    title: &str,
    lines: &[Line],
    names: &[String],
    log_y: bool,
) -> Result<(), String> {
    let (x0, x1, y0, y1) = bounds(lines);
    let root = SVGBackend::new(path, (CHART_WIDTH_PX, CHART_HEIGHT_PX)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (plot, legend_area) = root.split_horizontally(CHART_WIDTH_PX - LEGEND_WIDTH_PX);
    legend(&legend_area, names)?;
    let x_range = x0.min(0.0)..x1;
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc("seconds since the end of warm-up")
                .label_style(("sans-serif", AXIS_FONT_PX))
                .axis_desc_style(("sans-serif", AXIS_FONT_PX))
                .y_labels(10)
                .y_label_formatter(&|y| axis_number(*y))
                .draw()
                .map_err(|e| e.to_string())?;
            for (group, pts) in lines {
                let c = color(*group);
                chart
                    .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
                    .map_err(|e| e.to_string())?;
                chart
                    .draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))
                    .map_err(|e| e.to_string())?;
            }
        }};
    }
    let mut builder = ChartBuilder::on(&plot);
    builder
        .caption(title, ("sans-serif", TITLE_FONT_PX))
        .margin(10)
        .margin_right(PLOT_MARGIN_RIGHT_PX)
        .x_label_area_size(50)
        .y_label_area_size(80);
    if log_y {
        draw!(builder
            .build_cartesian_2d(
                x_range,
                ((y0 / 1.5).max(LATENCY_FLOOR_MS)..y1 * 1.5).log_scale()
            )
            .map_err(|e| e.to_string())?);
    } else {
        draw!(builder
            .build_cartesian_2d(x_range, 0.0..y1 * 1.1)
            .map_err(|e| e.to_string())?);
    }
    root.present().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nines_scale_puts_each_nine_one_apart() {
        assert!((nines(90.0) - 1.0).abs() < 1e-9);
        assert!((nines(99.99) - 4.0).abs() < 1e-6);
        assert_eq!(percentile_label(2.0), "p99");
        assert_eq!(percentile_label(3.0), "p99.9");
    }
}

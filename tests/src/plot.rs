//! SVG plots of the overload benchmark (plotters).

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

use crate::scenario::{BenchResult, StepResult, TimelineBucket, LEVEL_ALL_OPEN};

pub(crate) type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
pub(crate) type Chart<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(0, 0, 0),
];

fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// The same colour for a contender in every plot.
fn color_of(name: &str) -> RGBColor {
    let known = ["direct", "haproxy", "weir-dagor", "weir", "weir-goodput"];
    color(known.iter().position(|n| *n == name).unwrap_or(9))
}

fn contenders(r: &BenchResult) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for l in &r.loads {
        if !names.contains(&l.contender) {
            names.push(l.contender.clone());
        }
    }
    names
}

/// One labelled line in `color`, with its legend entry.
pub(crate) fn line(
    chart: &mut Chart<'_, '_>,
    points: Vec<(f64, f64)>,
    label: &str,
    color: RGBColor,
) -> anyhow::Result<()> {
    chart
        .draw_series(LineSeries::new(points, color.stroke_width(2)))
        .map_err(err)?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    Ok(())
}

/// The legend box every plot uses.
pub(crate) fn legend<'a, 'b: 'a>(
    chart: &mut Chart<'a, 'b>,
    position: SeriesLabelPosition,
) -> anyhow::Result<()> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)
}

pub(crate) fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("plotting: {e}")
}

/// Writes `goodput.svg` and `classes.svg` (steady loads), and for each step run of the
/// first app and mix `step-<contender>.svg` into `dir`; returns the files written.
pub fn write_all(r: &BenchResult, dir: &Path) -> anyhow::Result<Vec<String>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    if !r.loads.is_empty() {
        goodput(r, &dir.join("goodput.svg"))?;
        classes(r, &dir.join("classes.svg"))?;
        written.extend(["goodput.svg".to_string(), "classes.svg".to_string()]);
    }
    let first = r.steps.first().map(|s| (s.app.clone(), s.mix.clone()));
    for step in r.steps.iter().filter(|s| Some((s.app.clone(), s.mix.clone())) == first) {
        let name = format!("step-{}.svg", step.contender);
        step_plot(step, &dir.join(&name))?;
        written.push(name);
    }
    Ok(written)
}

fn max_load(r: &BenchResult) -> f64 {
    r.config.loads.iter().cloned().fold(1.0, f64::max) * 1.05
}

/// Goodput / capacity against offered load, one line per contender, plus the ideal.
fn goodput(r: &BenchResult, path: &Path) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let x_max = max_load(r);
    let mut chart = ChartBuilder::on(&root)
        .caption("Goodput vs offered load", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0f64..x_max, 0f64..1.15f64)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("offered load (x measured capacity)")
        .y_desc("goodput / capacity")
        .draw()
        .map_err(err)?;
    let ideal = vec![(0.0, 0.0), (1.0, 1.0), (x_max, 1.0)];
    chart
        .draw_series(LineSeries::new(ideal, ShapeStyle::from(&BLACK.mix(0.4)).stroke_width(1)))
        .map_err(err)?
        .label("ideal")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.4)));
    for name in contenders(r).iter() {
        let points: Vec<(f64, f64)> = r
            .loads
            .iter()
            .filter(|l| &l.contender == name)
            .map(|l| (l.multiple, l.goodput_ratio))
            .collect();
        let c = color_of(name);
        line(&mut chart, points.clone(), name, c)?;
        chart
            .draw_series(points.into_iter().map(|p| Circle::new(p, 4, c.filled())))
            .map_err(err)?;
    }
    legend(&mut chart, SeriesLabelPosition::LowerLeft)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Per-class success ratio against offered load, one panel per contender.
fn classes(r: &BenchResult, path: &Path) -> anyhow::Result<()> {
    let names = contenders(r);
    let cols = 2;
    let rows = names.len().div_ceil(cols).max(1);
    let root = SVGBackend::new(path, (1000, 360 * rows as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let panels = root.split_evenly((rows, cols));
    for (name, panel) in names.iter().zip(panels.iter()) {
        class_panel(r, name, panel)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

fn class_panel(r: &BenchResult, name: &str, panel: &Area<'_>) -> anyhow::Result<()> {
    let mut chart = ChartBuilder::on(panel)
        .caption(format!("{name}: success by class"), ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(45)
        .build_cartesian_2d(0f64..max_load(r), 0f64..1.05f64)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("offered load (x capacity)")
        .y_desc("success")
        .draw()
        .map_err(err)?;
    let loads: Vec<_> = r.loads.iter().filter(|l| l.contender == name).collect();
    let class_names: Vec<String> = loads
        .first()
        .map(|l| l.classes.iter().map(|c| c.name.clone()).collect())
        .unwrap_or_default();
    for (i, class) in class_names.iter().enumerate() {
        let points: Vec<(f64, f64)> = loads
            .iter()
            .filter_map(|l| l.classes.get(i).map(|c| (l.multiple, c.success_ratio())))
            .collect();
        let c = color(i);
        line(&mut chart, points, class.as_str(), c)?;
    }
    legend(&mut chart, SeriesLabelPosition::LowerLeft)?;
    Ok(())
}

/// One step run over time: weir's level, in-flight limit and queuing time (from
/// `/v1/status`), and admitted / refused per class per second (from the clients).
fn step_plot(step: &StepResult, path: &Path) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (1000, 1300)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let panels = root.split_evenly((4, 1));
    let t_max = step.timeline.last().map_or(1.0, |b| b.at_secs + 0.25);
    let title = format!("{} - app {}, mix {}", step.contender, step.app, step.mix);
    let status = &step.status;
    // B + U/128, so the business classes in use (0, 1, 2) read off the axis; anything
    // from 3.0 up (fully open is 255.127) is drawn at 3.
    let level: Vec<(f64, f64)> = status
        .iter()
        .map(|p| (p.at_secs, f64::from(p.level().min(LEVEL_ALL_OPEN)) / 128.0))
        .collect();
    time_panel(
        &panels[0],
        &format!("{title}: admission level as B + U/128 (3 = every class admitted)"),
        "level",
        t_max,
        3.1,
        vec![("level".into(), level)],
    )?;
    let limit: Vec<(f64, f64)> =
        status.iter().map(|p| (p.at_secs, p.inflight_limit() as f64)).collect();
    let inflight: Vec<(f64, f64)> =
        status.iter().map(|p| (p.at_secs, p.doc.inflight as f64)).collect();
    let queued: Vec<(f64, f64)> =
        status.iter().map(|p| (p.at_secs, p.doc.queue_depth as f64)).collect();
    let y =
        [&limit, &inflight, &queued].iter().flat_map(|v| v.iter().map(|p| p.1)).fold(8.0, f64::max)
            * 1.1;
    time_panel(
        &panels[1],
        "in-flight limit, in flight to the app, waiting in weir",
        "requests",
        t_max,
        y,
        vec![("limit".into(), limit), ("in flight".into(), inflight), ("queued".into(), queued)],
    )?;
    let queuing: Vec<(f64, f64)> =
        status.iter().filter_map(|p| Some((p.at_secs, p.doc.mean_queuing_ms?))).collect();
    let y = queuing.iter().map(|p| p.1).fold(30.0, f64::max) * 1.1;
    time_panel(
        &panels[2],
        "mean queuing time of the last window (ms)",
        "ms",
        t_max,
        y,
        vec![("queuing".into(), queuing)],
    )?;
    let per_sec = |b: &TimelineBucket, v: &Vec<u64>, k: usize| {
        let width = 0.25;
        (b.at_secs + width / 2.0, v.get(k).copied().unwrap_or(0) as f64 / width)
    };
    let names = ["critical", "normal", "background"];
    let mut lines = Vec::new();
    for (k, name) in names.iter().enumerate() {
        lines.push((
            format!("{name} admitted"),
            step.timeline.iter().map(|b| per_sec(b, &b.ok, k)).collect::<Vec<_>>(),
        ));
        lines.push((
            format!("{name} refused"),
            step.timeline.iter().map(|b| per_sec(b, &b.refused, k)).collect(),
        ));
        lines.push((
            format!("{name} timed out"),
            step.timeline.iter().map(|b| per_sec(b, &b.timed_out, k)).collect(),
        ));
    }
    let y = lines.iter().flat_map(|(_, v)| v.iter().map(|p| p.1)).fold(10.0, f64::max) * 1.1;
    time_panel(
        &panels[3],
        "per class, per second (250 ms buckets by send time)",
        "requests / s",
        t_max,
        y,
        lines,
    )?;
    root.present().map_err(err)?;
    Ok(())
}

/// A captioned chart on `panel` with its mesh and axis names: the frame every panel of the
/// benchmarks' plots shares.
pub(crate) fn panel_chart<'a, 'b>(
    panel: &'a Area<'b>,
    caption: &str,
    (x_desc, x): (&str, std::ops::Range<f64>),
    (y_desc, y): (&str, std::ops::Range<f64>),
) -> anyhow::Result<Chart<'a, 'b>> {
    let mut chart = ChartBuilder::on(panel)
        .caption(caption, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(x, y)
        .map_err(err)?;
    chart.configure_mesh().x_desc(x_desc).y_desc(y_desc).draw().map_err(err)?;
    Ok(chart)
}

/// One panel of lines over time (seconds), shared by the benchmarks' timeline plots.
pub(crate) fn time_panel(
    panel: &Area<'_>,
    caption: &str,
    y_desc: &str,
    t_max: f64,
    y_max: f64,
    lines: Vec<(String, Vec<(f64, f64)>)>,
) -> anyhow::Result<()> {
    let mut chart = panel_chart(panel, caption, ("seconds", 0f64..t_max), (y_desc, 0f64..y_max))?;
    for (i, (name, points)) in lines.into_iter().enumerate() {
        line(&mut chart, points, &name, color(i))?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    Ok(())
}

//! SVG plots of the overload benchmark (plotters).

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

use crate::load::SecondReport;
use crate::scenario::BenchResult;

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(0, 0, 0),
];

fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// The same colour for a contender in every plot.
fn color_of(name: &str) -> RGBColor {
    let known = ["direct", "haproxy", "weir-dagor", "weir-default", "nginx"];
    color(known.iter().position(|n| *n == name).unwrap_or(5))
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
fn line(
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
fn legend<'a, 'b: 'a>(
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

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("plotting: {e}")
}

/// Writes `goodput.svg`, `classes.svg` and `step.svg` into `dir`.
pub fn write_all(r: &BenchResult, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    goodput(r, &dir.join("goodput.svg"))?;
    classes(r, &dir.join("classes.svg"))?;
    step(r, &dir.join("step.svg"))?;
    Ok(())
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

/// The step run over time: goodput, admitted queuing (client side), weir's level.
fn step(r: &BenchResult, path: &Path) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (1000, 980)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let panels = root.split_evenly((3, 1));
    let t_max = r.steps.iter().map(|s| s.series.len()).max().unwrap_or(1) as f64;
    let capacity = r.capacity.measured_rps;
    let service_ms = r.config.backend.service_time.as_secs_f64() * 1000.0;
    let goodput = |s: &SecondReport| Some(SecondReport::total(&s.ok) as f64 / capacity);
    let queuing = |s: &SecondReport| {
        (SecondReport::total(&s.ok) > 0).then(|| (s.ok_mean_ms - service_ms).max(0.0))
    };
    // Seconds in which nothing succeeded have no admitted latency: leave them out.
    let series_of = |f: &dyn Fn(&SecondReport) -> Option<f64>| -> Vec<(String, Vec<(f64, f64)>)> {
        r.steps
            .iter()
            .map(|s| {
                let points =
                    s.series.iter().filter_map(|b| Some((b.second as f64 + 0.5, f(b)?))).collect();
                (s.contender.clone(), points)
            })
            .collect()
    };
    let phases: Vec<f64> = r.config.step.clone();
    let caption = format!("Step {phases:?}x: goodput per second / capacity");
    time_panel(&panels[0], &caption, "goodput / capacity", t_max, 1.3, series_of(&goodput))?;
    let q = series_of(&queuing);
    let q_max = q.iter().flat_map(|(_, p)| p.iter().map(|p| p.1)).fold(40.0, f64::max) * 1.1;
    time_panel(
        &panels[1],
        "admitted latency minus service time (ms)",
        "queuing (ms)",
        t_max,
        q_max,
        q,
    )?;
    let levels: Vec<(String, Vec<(f64, f64)>)> = r
        .steps
        .iter()
        .filter(|s| !s.status.is_empty())
        .map(|s| {
            // B + U/128, so the business classes in use (0, 1, 2) read off the axis;
            // anything from 3.0 up (fully open is 255.127) is drawn at 3.
            let points = s
                .status
                .iter()
                .filter_map(|p| Some((p.at_secs, (p.level() as f64 / 128.0).min(3.0))))
                .collect();
            (s.contender.clone(), points)
        })
        .collect();
    let caption = "weir admission level as B + U/128 (3 = admits every class in use)";
    time_panel(&panels[2], caption, "level", t_max, 3.1, levels)?;
    root.present().map_err(err)?;
    Ok(())
}

fn time_panel(
    panel: &Area<'_>,
    caption: &str,
    y_desc: &str,
    t_max: f64,
    y_max: f64,
    lines: Vec<(String, Vec<(f64, f64)>)>,
) -> anyhow::Result<()> {
    let mut chart = ChartBuilder::on(panel)
        .caption(caption, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..t_max, 0f64..y_max)
        .map_err(err)?;
    chart.configure_mesh().x_desc("seconds").y_desc(y_desc).draw().map_err(err)?;
    for (name, points) in lines {
        let c = color_of(&name);
        line(&mut chart, points, &name, c)?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    Ok(())
}

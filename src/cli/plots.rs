//! SVG charts of simulation results (`allot sim --plots DIR`).

use std::path::{Path, PathBuf};

use anyhow::Context;
use plotters::prelude::*;

use allot_sim::SimResult;

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// Writes `jct_cdf.svg`, `allocation.svg` and `queue.svg` into `dir`; returns their paths.
pub fn write(dir: &Path, scenario: &str, results: &[SimResult]) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let cdf = dir.join("jct_cdf.svg");
    jct_cdf(&cdf, scenario, results).with_context(|| format!("drawing {}", cdf.display()))?;
    let allocation = dir.join("allocation.svg");
    over_time(
        &allocation,
        &format!("{scenario}: GPUs allocated"),
        "GPUs",
        results,
        |s| s.allocated_milli as f64 / 1000.0,
    )
    .with_context(|| format!("drawing {}", allocation.display()))?;
    let queue = dir.join("queue.svg");
    over_time(
        &queue,
        &format!("{scenario}: tasks waiting"),
        "tasks",
        results,
        |s| s.queued as f64,
    )
    .with_context(|| format!("drawing {}", queue.display()))?;
    Ok(vec![cdf, allocation, queue])
}

type DrawResult = anyhow::Result<()>;

fn jct_cdf(path: &Path, scenario: &str, results: &[SimResult]) -> DrawResult {
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let max = results
        .iter()
        .flat_map(|r| {
            r.outcomes
                .iter()
                .map(|o| (o.finish - o.submit) as f64 / 1000.0)
        })
        .fold(1.0f64, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("{scenario}: JCT CDF"), ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d((1f64..max * 1.1).log_scale(), 0f64..1f64)?;
    chart
        .configure_mesh()
        .x_desc("job completion time (s, log scale)")
        .y_desc("fraction of jobs")
        .draw()?;
    for (i, r) in results.iter().enumerate() {
        let mut jct: Vec<f64> = r
            .outcomes
            .iter()
            .map(|o| ((o.finish - o.submit) as f64 / 1000.0).max(1.0))
            .collect();
        jct.sort_by(f64::total_cmp);
        let n = jct.len().max(1) as f64;
        // At most ~2,000 points per curve: the SVG stays small and the shape is exact enough.
        let step = (jct.len() / 2_000).max(1);
        let points = jct
            .iter()
            .enumerate()
            .filter(|(k, _)| k % step == 0 || *k + 1 == jct.len())
            .map(|(k, v)| (*v, (k + 1) as f64 / n));
        let color = PALETTE[i % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(r.policy.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

fn over_time(
    path: &Path,
    title: &str,
    unit: &str,
    results: &[SimResult],
    value: impl Fn(&allot_sim::engine::Sample) -> f64,
) -> DrawResult {
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let days = |ms: u64| ms as f64 / 86_400_000.0;
    let max_x = results
        .iter()
        .flat_map(|r| r.timeline.last().map(|s| days(s.at)))
        .fold(1.0f64, f64::max);
    let max_y = results
        .iter()
        .flat_map(|r| r.timeline.iter().map(&value))
        .fold(1.0f64, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..max_x, 0f64..max_y * 1.05)?;
    chart
        .configure_mesh()
        .x_desc("days since the trace started")
        .y_desc(unit)
        .draw()?;
    for (i, r) in results.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(
                r.timeline.iter().map(|s| (days(s.at), value(s))),
                color.stroke_width(1),
            ))?
            .label(r.policy.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

//! Line plots as SVG through plotters (no system fonts: its built-in
//! text layout, text left to the SVG viewer).

use std::path::Path;

use plotters::coord::ranged1d::{Ranged, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::AnyResult;

type Series = [(String, Vec<(f64, f64)>)];

/// Distinct, readable line colours (the last for a reference line).
const COLORS: [RGBColor; 7] = [
    RGBColor(110, 110, 110),
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(0, 0, 0),
];

/// One line per series; `log_y` for a logarithmic y axis.
pub(crate) fn lines(
    path: &Path,
    title: &str,
    (x_label, y_label): (&str, &str),
    log_y: bool,
    series: &Series,
) -> AnyResult<()> {
    let all = || series.iter().flat_map(|(_, p)| p.iter().copied());
    let x_min = all().map(|(x, _)| x).fold(f64::INFINITY, f64::min);
    let x_max = all().map(|(x, _)| x).fold(f64::NEG_INFINITY, f64::max);
    let y_min = all().map(|(_, y)| y).fold(f64::INFINITY, f64::min);
    let y_max = all().map(|(_, y)| y).fold(0.0, f64::max);
    let x_range = x_min.min(x_max)..x_max.max(x_min + 1.0);
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(70);
    if log_y {
        let low = (y_min.max(1.0) / 1.5).max(1.0);
        let chart = builder
            .build_cartesian_2d(x_range, (low..y_max * 1.5).log_scale())
            .map_err(|e| e.to_string())?;
        draw(chart, x_label, y_label, series)?;
    } else {
        let chart = builder
            .build_cartesian_2d(x_range, 0.0..y_max * 1.05 + 1.0)
            .map_err(|e| e.to_string())?;
        draw(chart, x_label, y_label, series)?;
    }
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}

fn draw<'a, Y>(
    mut chart: ChartContext<'a, SVGBackend<'a>, Cartesian2d<RangedCoordf64, Y>>,
    x_label: &str,
    y_label: &str,
    series: &Series,
) -> AnyResult<()>
where
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let style = ShapeStyle::from(&color).stroke_width(2);
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), style))
            .map_err(|e| e.to_string())?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    Ok(())
}

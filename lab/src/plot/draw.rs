//! Drawing the figures with plotters, generic over the backend (PNG and SVG draw the same).
//!
//! Conventions: DejaVu Sans (see `font.rs`), colour-blind-safe Okabe–Ito colours with a fixed
//! colour per encoding and per RoPE scaling, viridis for heatmaps, log axes with explicit ticks
//! (1-2-5 per decade, powers of two for widths and lengths), units in every axis title.

use plotters::coord::Shift;
use plotters::prelude::*;

use super::data::{BarPanel, Curve, Heatmap, LawFigure, MiProfile, Stat};

/// Errors while drawing (the backend's, boxed).
pub type DrawResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// A figure: its pixel size and how to draw it on any backend.
pub trait Figure {
    /// Width and height in pixels (PNG) or SVG user units.
    fn size(&self) -> (u32, u32);
    /// Draw onto `root` (already filled white).
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static;
}

const FONT: &str = "sans-serif";
const TITLE: u32 = 28;
const PANEL_TITLE: u32 = 22;
const AXIS: u32 = 20;
const TICK: u32 = 17;
const LEGEND: u32 = 17;

// Okabe–Ito.
const BLUE: RGBColor = RGBColor(0, 114, 178);
const VERMILLION: RGBColor = RGBColor(213, 94, 0);
const GREEN: RGBColor = RGBColor(0, 158, 115);
const PURPLE: RGBColor = RGBColor(204, 121, 167);
const ORANGE: RGBColor = RGBColor(230, 159, 0);
const SKY: RGBColor = RGBColor(86, 180, 233);
const YELLOW: RGBColor = RGBColor(240, 228, 66);
const GREY: RGBColor = RGBColor(120, 120, 120);
// NoPE: Okabe–Ito black, apart from the grey of the training-length marker and the notes.
const NOPE_BLACK: RGBColor = RGBColor(0, 0, 0);
const PALETTE: [RGBColor; 7] = [BLUE, VERMILLION, GREEN, PURPLE, ORANGE, SKY, YELLOW];

/// The colour of a series label: fixed for encodings and RoPE scalings, else from the palette.
pub fn color_of(label: &str, index: usize) -> RGBColor {
    let scaling = label.strip_prefix("rope + ").unwrap_or(label);
    match scaling {
        "rope" | "none" => BLUE,
        "pope" => VERMILLION,
        "tapa" => GREEN,
        "nope" => NOPE_BLACK,
        "linear" => SKY,
        "ntk" => PURPLE,
        "yarn" => ORANGE,
        "dynamic" => YELLOW,
        _ => PALETTE[index % PALETTE.len()],
    }
}

/// What a series label means, for legends (`linear` → `linear (PI)`).
pub fn legend_name(label: &str) -> String {
    let explain = |s: &str| match s {
        "none" => "none (as trained)".to_string(),
        "linear" => "linear (PI)".to_string(),
        "ntk" => "NTK-aware".to_string(),
        "yarn" => "YaRN".to_string(),
        other => other.to_string(),
    };
    match label.strip_prefix("rope + ") {
        Some(s) => format!("RoPE, {}", explain(s)),
        None => match label {
            "rope" => "RoPE".into(),
            "pope" => "PoPE".into(),
            "tapa" => "TAPA".into(),
            "nope" => "NoPE".into(),
            other => explain(other),
        },
    }
}

fn font(size: u32) -> TextStyle<'static> {
    (FONT, size).into_font().into()
}

/// Split a 30-pixel footnote strip off the bottom of `area`, write `text` there (grey, 14 px)
/// and return the area above it.
fn with_footnote<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    text: &str,
) -> Result<DrawingArea<DB, Shift>, Box<dyn std::error::Error + Send + Sync>>
where
    DB::ErrorType: 'static,
{
    let (_, h) = area.dim_in_pixel();
    let (main, note) = area.split_vertically(h - 30);
    note.draw(&Text::new(text, (20, 4), font(14).color(&GREY)))?;
    Ok(main)
}

/// The series legend of `chart` in the figures' one style (white box, grey border, legend font).
fn draw_series_legend<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
    margin: u32,
) -> DrawResult
where
    DB: DrawingBackend + 'a,
    DB::ErrorType: 'static,
    CT: plotters::coord::CoordTranslate,
{
    chart
        .configure_series_labels()
        .position(position)
        .margin(margin)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.4))
        .label_font(font(LEGEND))
        .draw()?;
    Ok(())
}

/// Ticks for a log axis over `[lo, hi]`: 1, 2, 5 per decade (1..9 when that gives fewer than 3).
pub fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let ticks_for = |mults: &[f64]| {
        let mut t = Vec::new();
        let mut e = lo.log10().floor() as i32 - 1;
        while 10f64.powi(e) <= hi * 1.0001 {
            for m in mults {
                // Divide for negative exponents: 3 / 10 is the double nearest 0.3.
                let v = if e < 0 {
                    m / 10f64.powi(-e)
                } else {
                    m * 10f64.powi(e)
                };
                if v >= lo * 0.9999 && v <= hi * 1.0001 {
                    t.push(v);
                }
            }
            e += 1;
        }
        t
    };
    let t = ticks_for(&[1.0, 2.0, 5.0]);
    if t.len() >= 3 {
        t
    } else {
        ticks_for(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])
    }
}

/// Top of a percent axis for values up to `max` (fractions): the full 0–100 % when anything
/// passes 45 %, else the first of 5, 10, 20, 30, 45 % above 1.2 × `max`, so values near chance
/// stay visible (the axis labels say where the top is).
pub fn percent_top(max: f64) -> f64 {
    if !(max.is_finite()) || max > 0.45 {
        return 1.05;
    }
    [0.05, 0.1, 0.2, 0.3, 0.45]
        .into_iter()
        .find(|t| *t >= 1.2 * max)
        .unwrap_or(1.05)
}

fn fmt_percent(v: f64, top: f64) -> String {
    if top <= 0.1 {
        format!("{:.1} %", v * 100.0)
    } else {
        format!("{:.0} %", v * 100.0)
    }
}

/// Powers of two in `[lo, hi]` (width and length axes).
pub fn pow2_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut t = Vec::new();
    let mut v = 2f64.powi(lo.log2().ceil() as i32);
    while v <= hi * 1.0001 {
        t.push(v);
        v *= 2.0;
    }
    t
}

/// A tick label without trailing zeros: 0.05, 0.2, 1, 20, 1e-3 as `10⁻³`.
pub fn fmt_num(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    if !(1e-3..1e5).contains(&a) {
        let e = a.log10().round() as i32;
        if (a / 10f64.powi(e) - 1.0).abs() < 1e-9 {
            return format!("10{}", superscript(e));
        }
        let m = v / 10f64.powi(a.log10().floor() as i32);
        return format!("{}×10{}", fmt_num(m), superscript(a.log10().floor() as i32));
    }
    let s = format!("{v:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

fn superscript(e: i32) -> String {
    e.to_string()
        .chars()
        .map(|c| match c {
            '-' => '⁻',
            '0' => '⁰',
            '1' => '¹',
            '2' => '²',
            '3' => '³',
            '4' => '⁴',
            '5' => '⁵',
            '6' => '⁶',
            '7' => '⁷',
            '8' => '⁸',
            '9' => '⁹',
            c => c,
        })
        .collect()
}

/// A linear axis range plotters can draw from data bounds `(lo, hi)`: non-finite bounds (no
/// data, NaN, ±inf) become `fallback`, and an empty or single-valued range is widened around its
/// value (plotters' key-point search does not end on a degenerate range, issue 16).
pub fn safe_range(lo: f64, hi: f64, fallback: (f64, f64)) -> (f64, f64) {
    if !lo.is_finite() || !hi.is_finite() || lo > hi {
        return fallback;
    }
    if hi - lo <= f64::EPSILON * lo.abs().max(hi.abs()).max(1.0) {
        let half = 0.5 * lo.abs().max(1.0);
        return (lo - half, hi + half);
    }
    (lo, hi)
}

/// [`safe_range`] for a log axis: `(lo, hi)` when `0 < lo < hi` are finite, else a drawable
/// range around the positive finite bound (or `(0.1, 10)`).
pub fn safe_log_range(lo: f64, hi: f64) -> (f64, f64) {
    if lo > 0.0 && hi > lo && hi.is_finite() {
        return (lo, hi);
    }
    log_range([lo, hi].into_iter(), 2.0)
}

/// Log range padded by `pad` (a factor) on each side.
fn log_range(values: impl Iterator<Item = f64>, pad: f64) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| *v > 0.0 && v.is_finite())
        .fold((f64::INFINITY, 0.0f64), |(a, b), v| (a.min(v), b.max(v)));
    if !lo.is_finite() {
        return (0.1, 10.0);
    }
    if hi <= lo {
        return (lo / 2.0, hi * 2.0);
    }
    (lo / pad, hi * pad)
}

fn grid_style() -> ShapeStyle {
    BLACK.mix(0.12).stroke_width(1)
}

/// What a legend entry looks like.
#[derive(Clone, Copy)]
enum Swatch {
    /// A line with a dot (a fitted series and its points).
    LineDot(RGBColor),
    /// A dashed line.
    Dashed(RGBColor),
    /// A cross marker.
    Cross(RGBColor),
}

/// Legend entries in a grid of `cols` columns, drawn in their own area (never over data).
fn draw_legend_grid<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    items: &[(String, Swatch)],
    cols: usize,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let (w, _) = area.dim_in_pixel();
    let col_w = (w as i32 - 40) / cols.max(1) as i32;
    for (k, (label, sw)) in items.iter().enumerate() {
        let x = 30 + (k % cols) as i32 * col_w;
        let y = 14 + (k / cols) as i32 * LEGEND_ROW;
        match *sw {
            Swatch::LineDot(c) => {
                area.draw(&PathElement::new(
                    vec![(x, y), (x + 30, y)],
                    c.stroke_width(3),
                ))?;
                area.draw(&Circle::new((x + 15, y), 5, c.filled()))?;
            }
            Swatch::Dashed(c) => {
                for dx in [0, 12, 24] {
                    area.draw(&PathElement::new(
                        vec![(x + dx, y), (x + dx + 7, y)],
                        c.stroke_width(2),
                    ))?;
                }
            }
            Swatch::Cross(c) => area.draw(&Cross::new((x + 15, y), 6, c.stroke_width(2)))?,
        }
        area.draw(&Text::new(label.clone(), (x + 42, y - 10), font(LEGEND)))?;
    }
    Ok(())
}

const LEGEND_ROW: i32 = 28;

fn draw_legend_strip<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    items: &[(String, RGBColor)],
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    // One row of coloured squares and labels, centred.
    let widths: Vec<i32> = items
        .iter()
        .map(|(l, _)| 34 + (l.chars().count() as i32) * 9 + 24)
        .collect();
    let total: i32 = widths.iter().sum();
    let (w, h) = area.dim_in_pixel();
    let mut x = ((w as i32 - total) / 2).max(5);
    let y = h as i32 / 2;
    for ((label, color), width) in items.iter().zip(widths) {
        area.draw(&Rectangle::new(
            [(x, y - 9), (x + 24, y + 9)],
            color.filled(),
        ))?;
        area.draw(&Text::new(label.clone(), (x + 32, y - 10), font(LEGEND)))?;
        x += width;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------

/// Spectrum heatmaps: rows = variants, columns = layers, plus a colour bar.
pub struct SpectrumFigure {
    /// The panels.
    pub maps: Vec<Heatmap>,
    /// Encoding drawn (for the title).
    pub encoding: String,
}

impl SpectrumFigure {
    fn grid(&self) -> (Vec<String>, Vec<i64>) {
        let mut vars: Vec<String> = self.maps.iter().map(|m| m.variant.clone()).collect();
        vars.dedup();
        let mut layers: Vec<i64> = self.maps.iter().map(|m| m.layer).collect();
        layers.sort_unstable();
        layers.dedup();
        (vars, layers)
    }
}

fn edges(xs: &[f64]) -> Vec<f64> {
    // Geometric midpoints; the outer edges mirror the neighbouring step.
    let n = xs.len();
    if n == 1 {
        return vec![xs[0] / 2f64.sqrt(), xs[0] * 2f64.sqrt()];
    }
    let mut e = Vec::with_capacity(n + 1);
    e.push(xs[0] / (xs[1] / xs[0]).sqrt());
    for i in 0..n - 1 {
        e.push((xs[i] * xs[i + 1]).sqrt());
    }
    e.push(xs[n - 1] * (xs[n - 1] / xs[n - 2]).sqrt());
    e
}

impl Figure for SpectrumFigure {
    fn size(&self) -> (u32, u32) {
        let (vars, layers) = self.grid();
        (
            (430 * layers.len() as u32 + 150).max(700),
            400 * vars.len() as u32 + 100,
        )
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let (vars, layers) = self.grid();
        let enc = legend_name(&self.encoding);
        let root = root.titled(
            &format!("{enc} frequency use vs block width: energy share per rotary pair"),
            font(TITLE),
        )?;
        let (w, _) = root.dim_in_pixel();
        let main = with_footnote(
            &root,
            "cells: energy share of each rotary pair at the end of training, mean over heads and seeds (log colour scale); dashed line: π/B, the frequency the law predicts",
        )?;
        let (panels, bar) = main.split_horizontally(w - 150);
        let vmax = self
            .maps
            .iter()
            .flat_map(|m| m.share.iter().flatten())
            .copied()
            .filter(|v| v.is_finite())
            .fold(0.0f64, f64::max)
            .max(1e-9);
        // Log colour scale over two decades below the largest share.
        let vmin = vmax / 100.0;
        let shade =
            |v: f64| ViridisRGB::get_color(((v.max(vmin) / vmin).ln() / 100f64.ln()).min(1.0));
        let cells = panels.split_evenly((vars.len(), layers.len()));
        for (k, area) in cells.iter().enumerate() {
            let (var, layer) = (&vars[k / layers.len()], layers[k % layers.len()]);
            let Some(m) = self
                .maps
                .iter()
                .find(|m| &m.variant == var && m.layer == layer)
            else {
                continue;
            };
            let ws: Vec<f64> = m.widths.iter().map(|w| *w as f64).collect();
            let we = edges(&ws);
            // thetas descend with the pair index; edges on the ascending list.
            let mut th: Vec<f64> = m.thetas.clone();
            th.reverse();
            let te = edges(&th);
            let (x0, x1) = safe_log_range(we[0], *we.last().expect("edges"));
            let (y0, y1) = safe_log_range(te[0], *te.last().expect("edges"));
            let runs = if m.runs.iter().all(|r| *r == m.runs[0]) {
                format!("{} runs per width", m.runs[0])
            } else {
                format!(
                    "{}–{} runs per width",
                    m.runs.iter().min().expect("runs"),
                    m.runs.iter().max().expect("runs")
                )
            };
            let mut chart = ChartBuilder::on(area)
                .caption(format!("{var}, layer {layer} ({runs})"), font(PANEL_TITLE))
                .margin(8)
                .x_label_area_size(52)
                .y_label_area_size(78)
                .build_cartesian_2d(
                    (x0..x1).log_scale().with_key_points(ws.clone()),
                    (y0..y1).log_scale().with_key_points(log_ticks(y0, y1)),
                )?;
            chart
                .configure_mesh()
                .disable_mesh()
                .x_desc("block width B (tokens)")
                .y_desc("θ (rad/token)")
                .x_label_formatter(&|v| fmt_num(*v))
                .y_label_formatter(&|v| fmt_num(*v))
                .label_style(font(TICK))
                .axis_desc_style(font(AXIS))
                .draw()?;
            for (i, row) in m.share.iter().enumerate() {
                // row i is pair i (θ descending) → ascending index n-1-i
                let r = th.len() - 1 - i;
                for (j, v) in row.iter().enumerate() {
                    let color = if v.is_finite() {
                        shade(*v).filled()
                    } else {
                        RGBColor(220, 220, 220).filled()
                    };
                    chart.draw_series(std::iter::once(Rectangle::new(
                        [(we[j], te[r]), (we[j + 1], te[r + 1])],
                        color,
                    )))?;
                }
            }
            let reference: Vec<(f64, f64)> = (0..=40)
                .map(|k| x0 * (x1 / x0).powf(k as f64 / 40.0))
                .map(|w| (w, std::f64::consts::PI / w))
                .filter(|(_, t)| *t >= y0 && *t <= y1)
                .collect();
            chart.draw_series(DashedLineSeries::new(
                reference,
                10,
                6,
                WHITE.stroke_width(3),
            ))?;
        }
        // Colour bar.
        let bar = bar.margin(60, 70, 10, 20);
        let mut cb = ChartBuilder::on(&bar)
            .right_y_label_area_size(95)
            .build_cartesian_2d(
                0.0..1.0,
                (vmin..vmax)
                    .log_scale()
                    .with_key_points(log_ticks(vmin, vmax)),
            )?;
        cb.configure_mesh()
            .disable_mesh()
            .disable_x_axis()
            .y_desc("energy share (log scale)")
            .y_label_formatter(&|v| fmt_num(*v))
            .label_style(font(TICK))
            .axis_desc_style(font(AXIS))
            .draw()?;
        let steps = 100;
        cb.draw_series((0..steps).map(|k| {
            let a = vmin * 100f64.powf(k as f64 / steps as f64);
            let b = vmin * 100f64.powf((k + 1) as f64 / steps as f64);
            Rectangle::new([(0.0, a), (1.0, b)], shade((a * b).sqrt()).filled())
        }))?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------

/// θ_eff against width on log-log axes, fitted lines, bootstrap bands and π/W.
pub struct LawPlot {
    /// The data.
    pub fig: LawFigure,
}

impl LawPlot {
    fn legend_items(&self) -> Vec<(String, Swatch)> {
        let f = &self.fig;
        let mut items: Vec<(String, Swatch)> = f
            .groups
            .iter()
            .enumerate()
            .map(|(k, g)| {
                let ci = g
                    .beta_ci
                    .map(|(lo, hi)| format!(" [{lo:.2}, {hi:.2}]"))
                    .unwrap_or_default();
                (
                    format!(
                        "{}: β = {:.2}{ci}, c = {}, R² = {:.2} ({} runs)",
                        g.group,
                        g.beta,
                        // three significant digits: c spans 0.005 (smoke) to π
                        fmt_num(format!("{:.2e}", g.c).parse().unwrap_or(g.c)),
                        g.r2,
                        g.points.len()
                    ),
                    Swatch::LineDot(PALETTE[k % PALETTE.len()]),
                )
            })
            .collect();
        items.push((
            "reference θ* = π/W (β = 1, c = π)".into(),
            Swatch::Dashed(BLACK),
        ));
        if !f.control.is_empty() {
            items.push((
                "NoPE control (not fitted)".into(),
                Swatch::Cross(NOPE_BLACK),
            ));
        }
        items
    }
}

impl Figure for LawPlot {
    fn size(&self) -> (u32, u32) {
        (
            1100,
            720 + LEGEND_ROW as u32 * self.legend_items().len() as u32 + 50,
        )
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let f = &self.fig;
        let items = self.legend_items();
        let (_, h) = root.dim_in_pixel();
        let (plot, below) = root.split_vertically(720);
        let (legend, note) = below.split_vertically(h - 720 - 36);
        draw_legend_grid(&legend, &items, 1)?;
        note.draw(&Text::new(
            "points: runs (one per seed); line: least-squares fit of ln θ_eff on ln W; band: 95 % pointwise bootstrap interval (seeds resampled)",
            (20, 8),
            font(14).color(&GREY),
        ))?;
        let ws = f
            .groups
            .iter()
            .flat_map(|g| g.points.iter().map(|p| p.0))
            .chain(f.control.iter().map(|c| c.1));
        let (x0, x1) = log_range(ws, 1.35);
        let ys = f
            .groups
            .iter()
            .flat_map(|g| {
                g.points
                    .iter()
                    .map(|p| p.1)
                    .chain(g.band.iter().flat_map(|b| [b.1, b.2]))
            })
            .chain(f.control.iter().map(|c| c.2))
            .chain([std::f64::consts::PI / x0, std::f64::consts::PI / x1]);
        let (y0, y1) = log_range(ys, 1.3);
        let mut chart = ChartBuilder::on(&plot)
            .caption(
                "Effective frequency θ_eff vs dependency width W (log-log)",
                font(TITLE),
            )
            .margin(16)
            .x_label_area_size(60)
            .y_label_area_size(90)
            .build_cartesian_2d(
                (x0..x1).log_scale().with_key_points(pow2_ticks(x0, x1)),
                (y0..y1).log_scale().with_key_points(log_ticks(y0, y1)),
            )?;
        chart
            .configure_mesh()
            .x_desc("dependency width W = block length B (tokens)")
            .y_desc("θ_eff (rad/token)")
            .x_label_formatter(&|v| fmt_num(*v))
            .y_label_formatter(&|v| fmt_num(*v))
            .label_style(font(TICK))
            .axis_desc_style(font(AXIS))
            .bold_line_style(grid_style())
            .light_line_style(TRANSPARENT)
            .draw()?;
        for (k, g) in f.groups.iter().enumerate() {
            let color = PALETTE[k % PALETTE.len()];
            let mut band: Vec<(f64, f64)> = g.band.iter().map(|b| (b.0, b.1)).collect();
            band.extend(g.band.iter().rev().map(|b| (b.0, b.2)));
            chart.draw_series(std::iter::once(Polygon::new(band, color.mix(0.18))))?;
            let line: Vec<(f64, f64)> = g
                .band
                .iter()
                .map(|b| (b.0, g.c * b.0.powf(-g.beta)))
                .collect();
            chart.draw_series(LineSeries::new(line, color.stroke_width(3)))?;
            chart.draw_series(
                g.points
                    .iter()
                    .map(|p| Circle::new((p.0, p.1), 5, color.filled())),
            )?;
        }
        chart.draw_series(
            f.control
                .iter()
                .map(|c| Cross::new((c.1, c.2), 6, NOPE_BLACK.stroke_width(2))),
        )?;
        let reference: Vec<(f64, f64)> = (0..=40)
            .map(|k| x0 * (x1 / x0).powf(k as f64 / 40.0))
            .map(|w| (w, std::f64::consts::PI / w))
            .collect();
        chart.draw_series(DashedLineSeries::new(
            reference,
            12,
            8,
            BLACK.stroke_width(2),
        ))?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------

/// Bars with seed spread (one bar per label), and an optional chance line.
pub struct BarsPlot {
    /// Figure title.
    pub title: String,
    /// y-axis title.
    pub y_desc: String,
    /// The bars.
    pub bars: Vec<super::data::Bar>,
    /// A horizontal reference (value, label), e.g. chance.
    pub reference: Option<(f64, String)>,
}

/// The label of category `v` on a categorical axis drawn at 0, 1, 2, … (empty between them).
fn category<T: std::fmt::Display>(labels: &[T], v: f64) -> String {
    if (v - v.round()).abs() > 1e-6 || v < -0.1 {
        return String::new();
    }
    labels
        .get(v.round() as usize)
        .map(|l| l.to_string())
        .unwrap_or_default()
}

fn whisker<DB: DrawingBackend, CT: plotters::coord::CoordTranslate<From = (f64, f64)>>(
    chart: &mut ChartContext<DB, CT>,
    x: f64,
    half: f64,
    s: &Stat,
    color: RGBColor,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    if s.values.len() > 1 {
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(x, s.min), (x, s.max)],
            color.stroke_width(2),
        )))?;
        for y in [s.min, s.max] {
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(x - half, y), (x + half, y)],
                color.stroke_width(2),
            )))?;
        }
    }
    Ok(())
}

impl Figure for BarsPlot {
    fn size(&self) -> (u32, u32) {
        ((220 * self.bars.len() as u32 + 260).max(800), 700)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let n = self.bars.len();
        let labels: Vec<String> = self
            .bars
            .iter()
            .map(|b| format!("{} (n = {})", legend_name(&b.label), b.stat.values.len()))
            .collect();
        let top = percent_top(
            self.bars
                .iter()
                .map(|b| b.stat.max)
                .chain(self.reference.iter().map(|r| r.0))
                .fold(0.0, f64::max),
        );
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, font(TITLE))
            .margin(16)
            .x_label_area_size(56)
            .y_label_area_size(80)
            .build_cartesian_2d(-0.5..n as f64 - 0.5, 0.0..top)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n)
            .y_desc(&self.y_desc)
            .x_label_formatter(&|v| category(&labels, *v))
            .y_label_formatter(&|v| fmt_percent(*v, top))
            .label_style(font(TICK))
            .axis_desc_style(font(AXIS))
            .bold_line_style(grid_style())
            .light_line_style(TRANSPARENT)
            .draw()?;
        for (i, b) in self.bars.iter().enumerate() {
            let x = i as f64;
            let color = color_of(&b.label, i);
            chart.draw_series(std::iter::once(Rectangle::new(
                [(x - 0.32, 0.0), (x + 0.32, b.stat.mean)],
                color.mix(0.75).filled(),
            )))?;
            whisker(&mut chart, x, 0.08, &b.stat, BLACK)?;
            let k = b.stat.values.len();
            chart.draw_series(b.stat.values.iter().enumerate().map(|(j, v)| {
                let dx = if k > 1 {
                    -0.16 + 0.32 * j as f64 / (k - 1) as f64
                } else {
                    0.0
                };
                Circle::new((x + dx, *v), 5, BLACK.filled())
            }))?;
            chart.draw_series(std::iter::once(Text::new(
                format!("{:.1} %", b.stat.mean * 100.0),
                (x - 0.12, b.stat.max.max(b.stat.mean) + 0.06 * top),
                font(LEGEND),
            )))?;
        }
        if let Some((v, label)) = &self.reference {
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(-0.5, *v), (n as f64 - 0.5, *v)],
                    10,
                    6,
                    BLACK.stroke_width(2),
                ))?
                .label(label.clone())
                .legend(|(x, y)| {
                    PathElement::new(vec![(x, y), (x + 24, y)], BLACK.stroke_width(2))
                });
            draw_series_legend(&mut chart, SeriesLabelPosition::UpperLeft, 12)?;
        }
        root.draw(&Text::new(
            "bar: mean over seeds; dots: seeds; whiskers: min–max",
            (20, self.size().1 as i32 - 22),
            font(14).color(&GREY),
        ))?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------

/// Grouped bars in panels (the PI table).
pub struct GroupedBarsPlot {
    /// Figure title.
    pub title: String,
    /// The panels.
    pub panels: Vec<BarPanel>,
    /// What the groups are: [`GroupAxis::LengthRatio`] (the PI figure) or
    /// [`GroupAxis::BlockWidth`] (the ablation figure).
    pub groups: GroupAxis,
}

/// The meaning of a grouped-bar figure's groups (the panels' `ratios`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupAxis {
    /// Evaluation length / training length, labelled `2×`.
    LengthRatio,
    /// Block width B in tokens, labelled `B = 16`.
    BlockWidth,
    /// A transformer layer and head, encoded as `layer · 64 + head`
    /// ([`super::data::LAYER_HEAD_BASE`]), labelled `L0h1`; the bars are attention shares.
    LayerHead,
}

impl GroupAxis {
    fn label(self, v: f64) -> String {
        match self {
            GroupAxis::LengthRatio => format!("{}×", fmt_num(v)),
            GroupAxis::BlockWidth => format!("B = {}", fmt_num(v)),
            GroupAxis::LayerHead => {
                let g = v.round() as i64;
                let base = super::data::LAYER_HEAD_BASE;
                format!("L{}h{}", g / base, g % base)
            }
        }
    }
    fn y_desc(self) -> &'static str {
        match self {
            GroupAxis::LengthRatio | GroupAxis::BlockWidth => "accuracy",
            GroupAxis::LayerHead => "attention of the final token",
        }
    }
    fn x_desc(self) -> &'static str {
        match self {
            GroupAxis::LengthRatio => "evaluation length / training length",
            GroupAxis::BlockWidth => "block width B (tokens)",
            GroupAxis::LayerHead => "layer, head",
        }
    }
    fn footnote(self) -> &'static str {
        match self {
            GroupAxis::LengthRatio => {
                "bars: mean over seeds; whiskers: min–max over seeds; RoPE unless labelled otherwise; evaluated zero-shot at s × the training length"
            }
            GroupAxis::BlockWidth => {
                "bars: mean over seeds; whiskers: min–max over seeds; held-out accuracy at the training length; a band = 2 rotary pairs set to θ = 0 (docs/analysis-rules.md R5)"
            }
            GroupAxis::LayerHead => {
                "bars: mean over seeds of the final prompt token's attention on each part of the prompt, 256 held-out examples with shift ≠ 0; whiskers: min–max over seeds"
            }
        }
    }
}

impl GroupedBarsPlot {
    fn layout(&self) -> (usize, usize) {
        let n = self.panels.len().max(1);
        let cols = n.min(3);
        (n.div_ceil(cols), cols)
    }
    fn labels(&self) -> Vec<String> {
        let mut all: Vec<String> = Vec::new();
        for p in &self.panels {
            for l in &p.labels {
                if !all.contains(l) {
                    all.push(l.clone());
                }
            }
        }
        all
    }
}

impl Figure for GroupedBarsPlot {
    fn size(&self) -> (u32, u32) {
        let (rows, cols) = self.layout();
        (520 * cols as u32 + 20, 430 * rows as u32 + 150)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let (rows, cols) = self.layout();
        let root = root.titled(&self.title, font(TITLE))?;
        let all = self.labels();
        let (legend, rest) = root.split_vertically(44);
        let items: Vec<(String, RGBColor)> = all
            .iter()
            .enumerate()
            .map(|(i, l)| (legend_name(l), color_of(l, i)))
            .collect();
        draw_legend_strip(&legend, &items)?;
        let grid = with_footnote(&rest, self.groups.footnote())?;
        let areas = grid.split_evenly((rows, cols));
        for (p, area) in self.panels.iter().zip(areas.iter()) {
            let ng = p.ratios.len();
            let ratios: Vec<String> = p.ratios.iter().map(|r| self.groups.label(*r)).collect();
            let mut chart = ChartBuilder::on(area)
                .caption(&p.title, font(PANEL_TITLE))
                .margin(10)
                .x_label_area_size(50)
                .y_label_area_size(72)
                .build_cartesian_2d(-0.5..ng as f64 - 0.5, 0.0..1.05)?;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(ng)
                .x_desc(self.groups.x_desc())
                .y_desc(self.groups.y_desc())
                .x_label_formatter(&|v| category(&ratios, *v))
                .y_label_formatter(&|v| format!("{:.0} %", v * 100.0))
                .label_style(font(TICK))
                .axis_desc_style(font(AXIS))
                .bold_line_style(grid_style())
                .light_line_style(TRANSPARENT)
                .draw()?;
            for (g, row) in p.cells.iter().enumerate() {
                let present: Vec<(usize, &Stat)> = row
                    .iter()
                    .enumerate()
                    .filter_map(|(b, s)| s.as_ref().map(|s| (b, s)))
                    .collect();
                // Same bar width in every group; a group with fewer bars is centred.
                let width = 0.8 / p.labels.len().max(1) as f64;
                let start = g as f64 - width * present.len() as f64 / 2.0;
                for (slot, (b, s)) in present.iter().enumerate() {
                    let label = &p.labels[*b];
                    let ci = all.iter().position(|l| l == label).unwrap_or(0);
                    let color = color_of(label, ci);
                    let x = start + width * (slot as f64 + 0.5);
                    chart.draw_series(std::iter::once(Rectangle::new(
                        [(x - width * 0.45, 0.0), (x + width * 0.45, s.mean)],
                        color.filled(),
                    )))?;
                    whisker(&mut chart, x, width * 0.2, s, BLACK)?;
                }
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------

/// One panel of line plots over seeds.
pub struct LinePanel {
    /// Panel title.
    pub title: String,
    /// x-axis title (with unit).
    pub x_desc: String,
    /// y-axis title (with unit).
    pub y_desc: String,
    /// The curves.
    pub curves: Vec<Curve>,
    /// Log-2 x axis (lengths) instead of linear.
    pub log2_x: bool,
    /// Percent y axis in [0, 1] instead of a fitted linear one.
    pub percent_y: bool,
    /// Vertical reference lines `(x, label)`.
    pub vlines: Vec<(f64, String)>,
    /// Where the legend goes (`None`: no legend).
    pub legend: Option<SeriesLabelPosition>,
}

/// A figure of line panels side by side.
pub struct LinesPlot {
    /// Figure title.
    pub title: String,
    /// The panels.
    pub panels: Vec<LinePanel>,
    /// A note under the figure.
    pub note: String,
}

fn draw_line_panel<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, p: &LinePanel) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let xs = p
        .curves
        .iter()
        .flat_map(|c| c.points.iter().map(|q| q.0))
        .chain(p.vlines.iter().map(|v| v.0));
    let xs: Vec<f64> = xs.filter(|x| x.is_finite()).collect();
    let (xmin, xmax) = safe_range(
        xs.iter().copied().fold(f64::INFINITY, f64::min),
        xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        (0.0, 1.0),
    );
    let (ylo, yhi) = if p.percent_y {
        let max = p
            .curves
            .iter()
            .flat_map(|c| c.points.iter().map(|q| q.1.max))
            .fold(0.0, f64::max);
        (0.0, percent_top(max))
    } else {
        let ys: Vec<f64> = p
            .curves
            .iter()
            .flat_map(|c| c.points.iter().flat_map(|q| [q.1.min, q.1.max]))
            .filter(|y| y.is_finite())
            .collect();
        let (lo, hi) = safe_range(
            ys.iter().copied().fold(f64::INFINITY, f64::min),
            ys.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            (0.0, 1.0),
        );
        let pad = ((hi - lo) * 0.08).max(1e-3);
        ((lo - pad).min(0.0f64.max(lo - pad)), hi + pad)
    };
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(&p.title, font(PANEL_TITLE))
        .margin(12)
        .x_label_area_size(56)
        .y_label_area_size(80);
    let yfmt = |v: &f64| {
        if p.percent_y {
            fmt_percent(*v, yhi)
        } else {
            fmt_num((v * 1e4).round() / 1e4)
        }
    };
    macro_rules! finish {
        ($chart:ident) => {{
            $chart
                .configure_mesh()
                .x_desc(&p.x_desc)
                .y_desc(&p.y_desc)
                .x_label_formatter(&|v| fmt_num(*v))
                .y_label_formatter(&yfmt)
                .label_style(font(TICK))
                .axis_desc_style(font(AXIS))
                .bold_line_style(grid_style())
                .light_line_style(TRANSPARENT)
                .draw()?;
            for (x, label) in &p.vlines {
                $chart
                    .draw_series(DashedLineSeries::new(
                        vec![(*x, ylo), (*x, yhi)],
                        8,
                        6,
                        GREY.stroke_width(2),
                    ))?
                    .label(label.clone())
                    .legend(|(x, y)| {
                        PathElement::new(vec![(x, y), (x + 24, y)], GREY.stroke_width(2))
                    });
            }
            for (i, c) in p.curves.iter().enumerate() {
                let color = color_of(&c.label, i);
                let multi = c.points.iter().any(|q| q.1.values.len() > 1);
                if multi {
                    let mut band: Vec<(f64, f64)> =
                        c.points.iter().map(|q| (q.0, q.1.min)).collect();
                    band.extend(c.points.iter().rev().map(|q| (q.0, q.1.max)));
                    $chart.draw_series(std::iter::once(Polygon::new(band, color.mix(0.15))))?;
                }
                let dashed = c.label.ends_with("+ none") || c.label == "none";
                let pts: Vec<(f64, f64)> = c.points.iter().map(|q| (q.0, q.1.mean)).collect();
                let style = color.stroke_width(3);
                if dashed {
                    $chart.draw_series(DashedLineSeries::new(pts.clone(), 10, 5, style))?;
                } else {
                    $chart.draw_series(LineSeries::new(pts.clone(), style))?;
                }
                $chart
                    .draw_series(pts.iter().map(|q| Circle::new(*q, 5, color.filled())))?
                    .label(legend_name(&c.label))
                    .legend(move |(x, y)| {
                        EmptyElement::at((x, y))
                            + PathElement::new(vec![(0, 0), (24, 0)], color.stroke_width(3))
                            + Circle::new((12, 0), 5, color.filled())
                    });
            }
            if let Some(pos) = &p.legend {
                draw_series_legend(&mut $chart, pos.clone(), 10)?;
            }
        }};
    }
    if p.log2_x && xmin > 0.0 {
        let (x0, x1) = (xmin / 1.25, xmax * 1.25);
        // Below 1 (learning rates) the ticks are the values drawn, not powers of two.
        let ticks = if xmax < 1.0 {
            let mut t = xs.clone();
            t.sort_by(f64::total_cmp);
            t.dedup();
            t
        } else {
            pow2_ticks(x0, x1)
        };
        let mut chart =
            builder.build_cartesian_2d((x0..x1).log_scale().with_key_points(ticks), ylo..yhi)?;
        finish!(chart);
    } else {
        let pad = ((xmax - xmin) * 0.06).max(0.5);
        let mut chart = builder.build_cartesian_2d((xmin - pad)..(xmax + pad), ylo..yhi)?;
        finish!(chart);
    }
    Ok(())
}

impl Figure for LinesPlot {
    fn size(&self) -> (u32, u32) {
        (620 * self.panels.len() as u32 + 40, 720)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let root = root.titled(&self.title, font(TITLE))?;
        let grid = with_footnote(&root, &self.note)?;
        let areas = grid.split_evenly((1, self.panels.len()));
        for (p, a) in self.panels.iter().zip(areas.iter()) {
            draw_line_panel(a, p)?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------

/// MI profiles: per corpus, MI against lag in tokens and against lag in characters.
pub struct MiPlot {
    /// The profiles.
    pub profiles: Vec<MiProfile>,
    /// Two panels per corpus, raw lag and lag × characters per token (the collapse across
    /// granularities); else one raw-lag panel per corpus, two corpora per row.
    pub rescaled: bool,
}

impl MiPlot {
    fn corpora(&self) -> Vec<String> {
        let mut c: Vec<String> = self.profiles.iter().map(|p| p.corpus.clone()).collect();
        c.dedup();
        c
    }
}

impl Figure for MiPlot {
    fn size(&self) -> (u32, u32) {
        let n = self.corpora().len() as u32;
        let rows = if self.rescaled { n } else { n.div_ceil(2) };
        (1300, 560 * rows + 90)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let root = root.titled(
            if self.rescaled {
                "Mutual information between tokens vs distance, per granularity"
            } else {
                "Mutual information between tokens vs distance, synthetic tasks"
            },
            font(TITLE),
        )?;
        let grid = with_footnote(
            &root,
            "filled markers: MI above the shuffled-text bound (significant); hollow: not; non-positive estimates omitted (log axes)",
        )?;
        let corpora = self.corpora();
        let rows = if self.rescaled {
            corpora.len()
        } else {
            corpora.len().div_ceil(2)
        };
        let areas = grid.split_evenly((rows, 2));
        for (ci, corpus) in corpora.iter().enumerate() {
            let profiles: Vec<&MiProfile> = self
                .profiles
                .iter()
                .filter(|p| &p.corpus == corpus)
                .collect();
            let panels: &[bool] = if self.rescaled {
                &[false, true]
            } else {
                &[false]
            };
            for (k, &chars) in panels.iter().enumerate() {
                let area = if self.rescaled {
                    &areas[ci * 2 + k]
                } else {
                    &areas[ci]
                };
                let pts = |p: &MiProfile| -> Vec<(f64, f64, bool)> {
                    p.points
                        .iter()
                        .map(|q| (if chars { q.1 } else { q.0 }, q.2, q.3))
                        .filter(|q| q.0 > 0.0 && q.1 > 0.0 && q.1.is_finite())
                        .collect()
                };
                let (x0, x1) = log_range(profiles.iter().flat_map(|p| pts(p)).map(|q| q.0), 1.3);
                let (y0, y1) = log_range(profiles.iter().flat_map(|p| pts(p)).map(|q| q.1), 1.5);
                let title = if chars {
                    format!("{corpus}: lag rescaled to characters")
                } else {
                    format!("{corpus}: raw lag")
                };
                let mut chart = ChartBuilder::on(area)
                    .caption(title, font(PANEL_TITLE))
                    .margin(12)
                    .x_label_area_size(56)
                    .y_label_area_size(90)
                    .build_cartesian_2d(
                        (x0..x1).log_scale().with_key_points(log_ticks(x0, x1)),
                        (y0..y1).log_scale().with_key_points(log_ticks(y0, y1)),
                    )?;
                chart
                    .configure_mesh()
                    .x_desc(if chars {
                        "lag × mean characters per token (characters)"
                    } else {
                        "lag (tokens)"
                    })
                    .y_desc("mutual information (nats)")
                    .x_label_formatter(&|v| fmt_num(*v))
                    .y_label_formatter(&|v| fmt_num(*v))
                    .label_style(font(TICK))
                    .axis_desc_style(font(AXIS))
                    .bold_line_style(grid_style())
                    .light_line_style(TRANSPARENT)
                    .draw()?;
                for (i, p) in profiles.iter().enumerate() {
                    let color = PALETTE[i % PALETTE.len()];
                    let q = pts(p);
                    chart.draw_series(LineSeries::new(
                        q.iter().map(|q| (q.0, q.1)),
                        color.stroke_width(2),
                    ))?;
                    chart
                        .draw_series(q.iter().map(|q| {
                            let style = if q.2 {
                                color.filled()
                            } else {
                                color.stroke_width(2)
                            };
                            Circle::new((q.0, q.1), 5, style)
                        }))?
                        .label(p.granularity.clone())
                        .legend(move |(x, y)| {
                            EmptyElement::at((x, y))
                                + PathElement::new(vec![(0, 0), (24, 0)], color.stroke_width(2))
                                + Circle::new((12, 0), 5, color.filled())
                        });
                }
                // One profile per panel (the synthetic tasks): the title names it, and a legend
                // would only hide data.
                if profiles.len() > 1 {
                    draw_series_legend(&mut chart, SeriesLabelPosition::UpperRight, 10)?;
                }
            }
        }
        Ok(())
    }
}

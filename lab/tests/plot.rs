//! `lab plot`: the series each figure draws, computed from hand-made tables with known answers,
//! and the figure files written for every sweep (PNG of the right size, SVG with its labels).

use std::f64::consts::PI;
use std::path::{Path, PathBuf};

use lab::plot::data::{self, Table};
use lab::plot::draw::{fmt_num, log_ticks, pow2_ticks};
use lab::plot::{PlotError, SWEEP_FIGURES, plot_sweep};
use lab::results::{TableBuilder, write_batch};

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lab-plot-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// A runs table: (run_id, encoding, variant, width, seed, θ_eff, accuracy, status).
type RunRow<'a> = (&'a str, &'a str, &'a str, i64, i64, f64, f64, &'a str);

fn runs_table(rows: &[RunRow]) -> Table {
    let b = TableBuilder::new(rows.len())
        .str("run_id", rows.iter().map(|r| r.0.to_string()).collect())
        .str("status", rows.iter().map(|r| r.7.to_string()).collect())
        .str("task", vec!["block".into(); rows.len()])
        .str("encoding", rows.iter().map(|r| r.1.to_string()).collect())
        .str("variant", rows.iter().map(|r| r.2.to_string()).collect())
        .i64("block_len", rows.iter().map(|r| r.3).collect())
        .i64("dep_width", rows.iter().map(|r| r.3).collect())
        .i64("ops", rows.iter().map(|r| r.3).collect())
        .i64("seed", rows.iter().map(|r| r.4).collect())
        .opt_f64("effective_freq", rows.iter().map(|r| Some(r.5)).collect())
        .opt_f64(
            "final_eval_accuracy",
            rows.iter().map(|r| Some(r.6)).collect(),
        )
        .opt_f64("answer_accuracy", rows.iter().map(|r| Some(r.6)).collect())
        .build();
    Table::from_batches("runs", vec![b])
}

/// Spectrum rows (run_id, step, layer, head, freq_index, theta, energy_frac).
fn spectrum_table(rows: &[(&str, i64, i64, i64, i64, f64, f64)]) -> Table {
    let b = TableBuilder::new(rows.len())
        .str("run_id", rows.iter().map(|r| r.0.to_string()).collect())
        .str("encoding", vec!["rope".into(); rows.len()])
        .i64("step", rows.iter().map(|r| r.1).collect())
        .i64("layer", rows.iter().map(|r| r.2).collect())
        .i64("head", rows.iter().map(|r| r.3).collect())
        .i64("freq_index", rows.iter().map(|r| r.4).collect())
        .f64("theta", rows.iter().map(|r| r.5).collect())
        .f64("energy", rows.iter().map(|r| r.6).collect())
        .f64("energy_frac", rows.iter().map(|r| r.6).collect())
        .build();
    Table::from_batches("spectrum", vec![b])
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9 * (1.0 + b.abs())
}

#[test]
fn heatmap_uses_last_step_averages_heads_then_seeds_and_skips_other_runs() {
    let runs = runs_table(&[
        ("a", "rope", "recall", 4, 0, 0.5, 1.0, "done"),
        ("b", "rope", "recall", 4, 1, 0.5, 1.0, "done"),
        ("c", "rope", "recall", 16, 0, 0.2, 1.0, "done"),
        ("d", "nope", "recall", 4, 0, 0.5, 1.0, "done"),
        ("e", "rope", "recall", 16, 1, 0.2, 1.0, "failed"),
    ]);
    let mut rows = Vec::new();
    // Step 0 rows must be ignored (they would pull every value to 0.5).
    for id in ["a", "b", "c", "d", "e"] {
        for h in 0..2 {
            rows.push((id, 0, 0, h, 0, 1.0, 0.5));
            rows.push((id, 0, 0, h, 1, 0.01, 0.5));
        }
    }
    // Final step 40: run a heads (0.8, 0.6) → 0.7; run b heads (0.9, 0.9) → 0.9; mean 0.8.
    for (id, h, p0) in [
        ("a", 0, 0.8),
        ("a", 1, 0.6),
        ("b", 0, 0.9),
        ("b", 1, 0.9),
        ("c", 0, 0.1),
        ("c", 1, 0.3),
        ("d", 0, 0.0),
        ("d", 1, 0.0),
        ("e", 0, 0.0),
        ("e", 1, 0.0),
    ] {
        rows.push((id, 40, 0, h, 0, 1.0, p0));
        rows.push((id, 40, 0, h, 1, 0.01, 1.0 - p0));
    }
    let maps = data::spectrum_heatmaps(&runs, &spectrum_table(&rows), "rope").unwrap();
    assert_eq!(maps.len(), 1);
    let m = &maps[0];
    assert_eq!((m.variant.as_str(), m.layer), ("recall", 0));
    assert_eq!(m.widths, vec![4, 16]);
    assert_eq!(m.thetas, vec![1.0, 0.01]);
    assert_eq!(m.runs, vec![2, 1], "the failed run e is not averaged");
    assert!(close(m.share[0][0], 0.8), "{:?}", m.share);
    assert!(close(m.share[1][0], 0.2));
    assert!(close(m.share[0][1], 0.2));
    assert!(close(m.share[1][1], 0.8));
}

#[test]
fn law_figure_recovers_pi_over_w_with_a_degenerate_band() {
    let mut rows = Vec::new();
    let ids: Vec<String> = (0..8).map(|i| format!("r{i}")).collect();
    let mut k = 0;
    for seed in [0, 1] {
        for w in [4, 8, 16, 32] {
            rows.push((
                ids[k].as_str(),
                "rope",
                "copy",
                w,
                seed,
                PI / w as f64,
                1.0,
                "done",
            ));
            k += 1;
        }
    }
    rows.push(("n0", "nope", "copy", 8, 0, 0.3, 1.0, "done"));
    let fig = data::law_figure(&runs_table(&rows), None, None).unwrap();
    assert_eq!(fig.groups.len(), 1);
    let g = &fig.groups[0];
    assert_eq!(g.group, "rope/copy");
    assert_eq!(g.points.len(), 8);
    assert!(close(g.beta, 1.0) && close(g.c, PI) && close(g.r2, 1.0));
    assert_eq!(g.beta_ci, None, "no fit table: refitted, no interval");
    assert_eq!(g.band.len(), 40);
    assert!(close(g.band[0].0, 4.0) && close(g.band[39].0, 32.0));
    // Every bootstrap replicate is the exact law, so the band is the line itself.
    for (w, lo, hi) in &g.band {
        assert!(close(*lo, PI / w) && close(*hi, PI / w), "{w}: {lo} {hi}");
    }
    assert_eq!(fig.control, vec![("copy".to_string(), 8.0, 0.3)]);

    // With the sweep's fit table, its numbers are the ones shown.
    let fit = TableBuilder::new(1)
        .str("group", s(&["rope/copy"]))
        .f64("beta", vec![0.9])
        .f64("c", vec![2.5])
        .f64("r2", vec![0.95])
        .f64("beta_ci_low", vec![0.8])
        .f64("beta_ci_high", vec![1.1])
        .build();
    let fig = data::law_figure(
        &runs_table(&rows),
        None,
        Some(&Table::from_batches("fit", vec![fit])),
    )
    .unwrap();
    let g = &fig.groups[0];
    assert_eq!(
        (g.beta, g.c, g.r2, g.beta_ci),
        (0.9, 2.5, 0.95, Some((0.8, 1.1)))
    );
}

/// With a `layers` table the figure has one group per pooling: the positional layer and every
/// layer, each fitted on its own θ_eff; the fit table's row is found by (group, pooling) among
/// the `W = B` fits.
#[test]
fn law_figure_has_a_group_per_layer_and_the_positional_one() {
    let widths = [4i64, 16, 64];
    let ids: Vec<String> = widths.iter().map(|w| format!("r{w}")).collect();
    let n = widths.len();
    let runs = TableBuilder::new(n)
        .str("run_id", ids.clone())
        .str("status", vec!["done".into(); n])
        .str("task", vec!["block".into(); n])
        .str("encoding", vec!["rope".into(); n])
        .str("variant", vec!["copy".into(); n])
        .i64("block_len", widths.to_vec())
        .i64("dep_width", widths.to_vec())
        .i64("seed", vec![0; n])
        .opt_f64("effective_freq", vec![Some(0.1); n])
        .opt_f64(
            "effective_freq_positional",
            widths.iter().map(|&w| Some(PI / w as f64)).collect(),
        )
        .build();
    let runs = Table::from_batches("runs", vec![runs]);
    // Layer 0 follows π/W (final rows), layer 1 is flat at 0.01; non-final rows are ignored.
    let mut lid = Vec::new();
    let (mut layer, mut th, mut fin) = (vec![], vec![], vec![]);
    for (k, &w) in widths.iter().enumerate() {
        for (l, t, f) in [(0, PI / w as f64, true), (1, 0.01, true), (0, 5.0, false)] {
            lid.push(ids[k].clone());
            layer.push(l);
            th.push(t);
            fin.push(f);
        }
    }
    let layers = TableBuilder::new(lid.len())
        .str("run_id", lid)
        .i64("layer", layer)
        .f64("effective_freq", th)
        .bool("is_final", fin)
        .build();
    let fit = TableBuilder::new(2)
        .str("group", s(&["rope/copy", "rope/copy"]))
        .str("pooling", s(&["positional", "positional"]))
        .str("width_source", s(&["mi", "dep_width"]))
        .f64("beta", vec![0.5, 0.99])
        .f64("c", vec![1.0, 3.0])
        .f64("r2", vec![0.5, 0.98])
        .f64("beta_ci_low", vec![0.1, 0.9])
        .f64("beta_ci_high", vec![0.9, 1.1])
        .build();
    let fig = data::law_figure(
        &runs,
        Some(&Table::from_batches("layers", vec![layers.clone()])),
        Some(&Table::from_batches("fit", vec![fit])),
    )
    .unwrap();
    let names: Vec<&str> = fig.groups.iter().map(|g| g.group.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "rope/copy · layer 0",
            "rope/copy · layer 1",
            "rope/copy · positional"
        ]
    );
    let l0 = &fig.groups[0];
    assert!(
        close(l0.beta, 1.0) && close(l0.c, PI),
        "refitted: no fit row for layer:0"
    );
    assert!(close(fig.groups[1].beta, 0.0));
    let pos = &fig.groups[2];
    assert_eq!(
        (pos.beta, pos.c, pos.beta_ci),
        (0.99, 3.0, Some((0.9, 1.1)))
    );
    // A fit of one seed has no interval to show (issue 16), as the sweep's summary says.
    let fit1 = TableBuilder::new(1)
        .str("group", s(&["rope/copy"]))
        .str("pooling", s(&["positional"]))
        .str("width_source", s(&["dep_width"]))
        .f64("beta", vec![0.99])
        .f64("c", vec![3.0])
        .f64("r2", vec![0.98])
        .f64("beta_ci_low", vec![0.99])
        .f64("beta_ci_high", vec![0.99])
        .i64("n_seeds", vec![1])
        .build();
    let fig = data::law_figure(
        &runs,
        Some(&Table::from_batches("layers", vec![layers])),
        Some(&Table::from_batches("fit", vec![fit1])),
    )
    .unwrap();
    let pos = fig
        .groups
        .iter()
        .find(|g| g.group.ends_with("positional"))
        .unwrap();
    assert_eq!((pos.beta, pos.beta_ci), (0.99, None));
}

#[test]
fn law_band_covers_scattered_runs() {
    // θ = π/W · e^{±0.2} by seed: the 95 % band at each W lies between the two seeds' lines
    // and is not degenerate.
    let mut rows = Vec::new();
    let ids: Vec<String> = (0..9).map(|i| format!("r{i}")).collect();
    let mut k = 0;
    for (seed, f) in [(0, 0.2f64), (1, -0.2), (2, 0.0)] {
        for w in [4, 16, 64] {
            rows.push((
                ids[k].as_str(),
                "rope",
                "recall",
                w,
                seed,
                PI / w as f64 * f.exp(),
                1.0,
                "done",
            ));
            k += 1;
        }
    }
    let fig = data::law_figure(&runs_table(&rows), None, None).unwrap();
    let g = &fig.groups[0];
    assert!(close(g.beta, 1.0), "seed offsets cancel: β = {}", g.beta);
    for (w, lo, hi) in &g.band {
        let line = g.c * w.powf(-g.beta);
        assert!(*lo <= line * (1.0 + 1e-9) && line <= *hi * (1.0 + 1e-9));
        assert!(*lo >= PI / w * (-0.2f64).exp() * (1.0 - 1e-9));
        assert!(*hi <= PI / w * 0.2f64.exp() * (1.0 + 1e-9));
        assert!(hi / lo > 1.01, "band must have width at {w}");
    }
}

#[test]
fn accuracy_bars_in_encoding_order_with_seed_spread() {
    let runs = runs_table(&[
        ("1", "nope", "copy", 2, 0, 0.0, 0.05, "done"),
        ("2", "rope", "copy", 2, 0, 0.0, 0.10, "done"),
        ("3", "rope", "copy", 2, 1, 0.0, 0.20, "done"),
        ("4", "pope", "copy", 2, 0, 0.0, 0.90, "done"),
        ("5", "pope", "copy", 2, 1, 0.0, 0.96, "done"),
        ("6", "pope", "copy", 2, 2, 0.0, 0.0, "failed"),
        ("7", "tapa", "copy", 2, 0, 0.0, 0.30, "done"),
    ]);
    let bars = data::accuracy_by_encoding(&runs).unwrap();
    let labels: Vec<&str> = bars.iter().map(|b| b.label.as_str()).collect();
    assert_eq!(labels, ["rope", "pope", "tapa", "nope"]);
    assert!(close(bars[0].stat.mean, 0.15));
    assert_eq!((bars[0].stat.min, bars[0].stat.max), (0.10, 0.20));
    assert!(close(bars[1].stat.mean, 0.93));
    assert_eq!(bars[1].stat.values.len(), 2, "failed run left out");
}

/// evals rows: (eval_name, task, variant, encoding, ratio, scaling, accuracy, seq_len, train, loss)
type EvalRow<'a> = (
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    f64,
    &'a str,
    f64,
    i64,
    i64,
    f64,
);

fn evals_table(rows: &[EvalRow]) -> Table {
    let b = TableBuilder::new(rows.len())
        .str("eval_name", rows.iter().map(|r| r.0.to_string()).collect())
        .str("task", rows.iter().map(|r| r.1.to_string()).collect())
        // As the lab writes it (schema 2): `variant` is null for rows of other tasks than block.
        .opt_str(
            "variant",
            rows.iter()
                .map(|r| (r.1 == "block").then(|| r.2.to_string()))
                .collect(),
        )
        .str("encoding", rows.iter().map(|r| r.3.to_string()).collect())
        .f64("length_ratio", rows.iter().map(|r| r.4).collect())
        .str("scaling", rows.iter().map(|r| r.5.to_string()).collect())
        .f64("accuracy", rows.iter().map(|r| r.6).collect())
        .i64("seq_len", rows.iter().map(|r| r.7).collect())
        .i64("train_seq_len", rows.iter().map(|r| r.8).collect())
        .f64("loss", rows.iter().map(|r| r.9).collect())
        .i64("seed", vec![0; rows.len()])
        .build();
    Table::from_batches("evals", vec![b])
}

fn pi_rows() -> Vec<EvalRow<'static>> {
    vec![
        (
            "fixed", "block", "recall", "rope", 4.0, "yarn", 0.5, 128, 32, 1.0,
        ),
        (
            "fixed", "block", "recall", "rope", 2.0, "linear", 0.4, 64, 32, 1.0,
        ),
        (
            "fixed", "block", "recall", "rope", 2.0, "linear", 0.6, 64, 32, 1.0,
        ),
        (
            "fixed", "block", "recall", "rope", 2.0, "none", 1.0, 64, 32, 1.0,
        ),
        (
            "fixed", "block", "recall", "pope", 2.0, "none", 0.9, 64, 32, 1.0,
        ),
        (
            "dilated", "block", "recall", "rope", 1.0, "none", 1.0, 32, 32, 1.0,
        ),
        (
            "fixed", "igsm", "copy", "rope", 2.0, "ntk", 0.3, 256, 128, 1.0,
        ),
    ]
}

/// The ablation figure's panels: per variant, groups = B, bars = unablated / law / far; rows
/// of entries without an ablated evaluation, of other encodings or lengths are left out.
#[test]
fn ablation_panels_group_by_width_and_band() {
    let rows: Vec<(&str, &str, i64, &str, &str, f64, f64)> = vec![
        // (run_id, variant, B, encoding, band, ratio, accuracy)
        ("a", "copy", 4, "rope", "", 1.0, 1.0),
        ("a", "copy", 4, "rope", "law", 1.0, 0.2),
        ("a", "copy", 4, "rope", "far", 1.0, 0.9),
        ("b", "copy", 4, "rope", "", 1.0, 0.8),
        ("b", "copy", 4, "rope", "law", 1.0, 0.4),
        ("c", "copy", 16, "rope", "", 1.0, 0.7),
        ("c", "copy", 16, "rope", "far", 1.0, 0.6),
        ("d", "copy", 16, "rope", "", 1.0, 0.1), // no ablation: not a baseline
        ("e", "copy", 16, "nope", "", 1.0, 0.5),
        ("a", "copy", 4, "rope", "law", 2.0, 0.0),
        ("f", "recall", 8, "rope", "", 1.0, 1.0),
        ("f", "recall", 8, "rope", "law", 1.0, 0.5),
    ];
    let n = rows.len();
    let b = TableBuilder::new(n)
        .str("run_id", rows.iter().map(|r| r.0.to_string()).collect())
        .str("eval_name", vec!["ablation".into(); n])
        .str("variant", rows.iter().map(|r| r.1.to_string()).collect())
        .i64("block_len", rows.iter().map(|r| r.2).collect())
        .str("encoding", rows.iter().map(|r| r.3.to_string()).collect())
        .str(
            "ablate_band",
            rows.iter().map(|r| r.4.to_string()).collect(),
        )
        .f64("length_ratio", rows.iter().map(|r| r.5).collect())
        .str("scaling", vec!["none".into(); n])
        .f64("accuracy", rows.iter().map(|r| r.6).collect())
        .build();
    let panels = data::ablation_panels(&Table::from_batches("evals", vec![b])).unwrap();
    assert_eq!(panels.len(), 2);
    let copy = &panels[0];
    assert_eq!(copy.title, "rope/copy");
    assert_eq!(copy.ratios, vec![4.0, 16.0]);
    assert_eq!(copy.labels, data::ABLATION_LABELS.to_vec());
    let mean = |g: usize, k: usize| copy.cells[g][k].as_ref().map(|s| s.mean);
    assert!(close(mean(0, 0).unwrap(), 0.9) && close(mean(0, 1).unwrap(), 0.3));
    assert!(close(mean(0, 2).unwrap(), 0.9));
    assert_eq!(copy.cells[1][0].as_ref().unwrap().values, vec![0.7]);
    assert_eq!(mean(1, 1), None);
    assert_eq!(panels[1].title, "rope/recall");
    // Tables without the column (written before ablations existed) give no panel.
    let old = TableBuilder::new(1).str("run_id", s(&["a"])).build();
    assert!(
        data::ablation_panels(&Table::from_batches("evals", vec![old]))
            .unwrap()
            .is_empty()
    );
}

#[test]
fn pi_panels_group_by_ratio_and_order_scalings() {
    let panels = data::pi_panels(&evals_table(&pi_rows())).unwrap();
    let titles: Vec<&str> = panels.iter().map(|p| p.title.as_str()).collect();
    assert_eq!(
        titles,
        [
            "dilated · block/recall",
            "fixed · block/recall",
            "fixed · igsm"
        ]
    );
    let p = &panels[1];
    assert_eq!(p.ratios, vec![2.0, 4.0]);
    assert_eq!(p.labels, s(&["none", "linear", "yarn", "pope"]));
    let at = |r: usize, b: usize| p.cells[r][b].as_ref().map(|s| s.mean);
    assert_eq!(at(0, 0), Some(1.0));
    assert!(close(at(0, 1).unwrap(), 0.5), "two seeds averaged");
    assert_eq!(at(0, 2), None, "no yarn row at 2×");
    assert_eq!(at(0, 3), Some(0.9));
    assert_eq!(at(1, 2), Some(0.5));
}

#[test]
fn length_curves_share_the_training_length_point() {
    let rows: Vec<EvalRow> = vec![
        (
            "needle", "needle", "copy", "rope", 1.0, "none", 0.9, 64, 64, 0.5,
        ),
        (
            "needle", "needle", "copy", "rope", 2.0, "none", 0.5, 128, 64, 2.0,
        ),
        (
            "needle", "needle", "copy", "rope", 2.0, "linear", 0.7, 128, 64, 0.8,
        ),
        (
            "needle", "needle", "copy", "pope", 1.0, "none", 0.8, 64, 64, 0.6,
        ),
        (
            "needle", "needle", "copy", "pope", 2.0, "none", 0.6, 128, 64, 1.5,
        ),
    ];
    let (curves, trains) = data::length_curves(&evals_table(&rows), "loss").unwrap();
    assert_eq!(trains, vec![64]);
    let labels: Vec<&str> = curves.iter().map(|c| c.label.as_str()).collect();
    assert_eq!(labels, ["rope + none", "rope + linear", "pope"]);
    let pts = |i: usize| -> Vec<(f64, f64)> {
        curves[i].points.iter().map(|(x, s)| (*x, s.mean)).collect()
    };
    assert_eq!(pts(0), vec![(64.0, 0.5), (128.0, 2.0)]);
    assert_eq!(pts(1), vec![(64.0, 0.5), (128.0, 0.8)]);
    assert_eq!(pts(2), vec![(64.0, 0.6), (128.0, 1.5)]);
}

#[test]
fn runs_curves_average_seeds_per_x() {
    let runs = runs_table(&[
        ("1", "rope", "copy", 2, 0, 0.2, 0.5, "done"),
        ("2", "rope", "copy", 2, 1, 0.4, 0.7, "done"),
        ("3", "rope", "copy", 4, 0, 0.1, 0.1, "done"),
        ("4", "pope", "copy", 4, 0, 0.05, 0.2, "done"),
    ]);
    let c = data::runs_curves(&runs, "ops", "effective_freq").unwrap();
    assert_eq!(c.len(), 2);
    assert_eq!(c[0].label, "rope");
    assert_eq!(c[0].points[0].0, 2.0);
    assert!(close(c[0].points[0].1.mean, 0.3));
    assert_eq!(c[0].points[1].1.values, vec![0.1]);
    assert_eq!(c[1].label, "pope");
}

#[test]
fn answer_curves_are_per_ops_over_seeds() {
    // Runs (id, ops, seed); run "x" failed and is left out.
    let rows = [("a", 2, 0), ("b", 2, 1), ("c", 4, 0), ("x", 3, 0)];
    let n = rows.len();
    let runs = Table::from_batches(
        "runs",
        vec![
            TableBuilder::new(n)
                .str("run_id", rows.iter().map(|r| r.0.to_string()).collect())
                .str(
                    "status",
                    rows.iter()
                        .map(|r| if r.0 == "x" { "failed" } else { "done" }.to_string())
                        .collect(),
                )
                .str("encoding", vec!["rope".into(); n])
                .i64("ops", rows.iter().map(|r| r.1).collect())
                .build(),
        ],
    );
    // Curves: eval rows at step 0 (no answers), 500 and 1000; one train row.
    let pts: [(&str, &str, i64, Option<f64>); 9] = [
        ("a", "eval", 0, None),
        ("a", "eval", 500, Some(0.25)),
        ("a", "eval", 1000, Some(0.5)),
        ("a", "train", 1000, Some(0.9)),
        ("b", "eval", 500, Some(0.75)),
        ("b", "eval", 1000, Some(1.0)),
        ("c", "eval", 500, Some(0.0)),
        ("c", "eval", 1000, Some(0.125)),
        ("x", "eval", 500, Some(0.5)),
    ];
    let curves = Table::from_batches(
        "curves",
        vec![
            TableBuilder::new(pts.len())
                .str("run_id", pts.iter().map(|p| p.0.to_string()).collect())
                .str("split", pts.iter().map(|p| p.1.to_string()).collect())
                .i64("step", pts.iter().map(|p| p.2).collect())
                .opt_f64("answer_accuracy", pts.iter().map(|p| p.3).collect())
                .build(),
        ],
    );
    let c = data::answer_curves_by_ops(&runs, &curves).unwrap();
    let labels: Vec<&str> = c.iter().map(|c| c.label.as_str()).collect();
    assert_eq!(labels, ["ops 2", "ops 4"]);
    let xs: Vec<f64> = c[0].points.iter().map(|p| p.0).collect();
    assert_eq!(xs, [500.0, 1000.0]);
    // ops 2 at step 1000: seeds 0.5 and 1.0 (the train row not counted).
    assert_eq!(c[0].points[1].1.values.len(), 2);
    assert!(close(c[0].points[1].1.mean, 0.75));
    assert!(close(c[1].points[1].1.mean, 0.125));
    // A curves table without the column: no curves.
    let bare = Table::from_batches(
        "curves",
        vec![
            TableBuilder::new(1)
                .str("run_id", vec!["a".into()])
                .str("split", vec!["eval".into()])
                .i64("step", vec![0])
                .build(),
        ],
    );
    assert!(data::answer_curves_by_ops(&runs, &bare).unwrap().is_empty());
}

/// A finished-runs table of iGSM RoPE runs: (run id, `ops`, `answer_accuracy`).
fn igsm_runs(rows: &[(&str, i64, f64)]) -> Table {
    let n = rows.len();
    Table::from_batches(
        "runs",
        vec![
            TableBuilder::new(n)
                .str("run_id", rows.iter().map(|r| r.0.to_string()).collect())
                .str("status", vec!["done".into(); n])
                .str("encoding", vec!["rope".into(); n])
                .i64("ops", rows.iter().map(|r| r.1).collect())
                .f64("answer_accuracy", rows.iter().map(|r| r.2).collect())
                .build(),
        ],
    )
}

/// `answer_curve_min_ops`: one model's `answers` rows become curves of their own size beside the
/// eval rows' (the run's `ops`); with models of several `ops` in the folder, the model's size is
/// named.
#[test]
fn answer_curves_include_smaller_sizes_of_one_model() {
    let runs =
        |rows: &[(&str, i64)]| igsm_runs(&rows.iter().map(|r| (r.0, r.1, 0.0)).collect::<Vec<_>>());
    // (run, split, step, answer accuracy, answer_ops)
    let pts: [(&str, &str, i64, Option<f64>, Option<i64>); 7] = [
        ("m", "eval", 0, None, None),
        ("m", "eval", 1000, Some(0.25), Some(4)),
        ("m", "answers", 1000, Some(0.5), Some(2)),
        ("m", "answers", 1000, Some(0.375), Some(3)),
        ("m", "eval", 2000, Some(0.5), Some(4)),
        ("m", "answers", 2000, Some(1.0), Some(2)),
        ("p", "eval", 1000, Some(0.75), None),
    ];
    let curves = Table::from_batches(
        "curves",
        vec![
            TableBuilder::new(pts.len())
                .str("run_id", pts.iter().map(|p| p.0.to_string()).collect())
                .str("split", pts.iter().map(|p| p.1.to_string()).collect())
                .i64("step", pts.iter().map(|p| p.2).collect())
                .opt_f64("answer_accuracy", pts.iter().map(|p| p.3).collect())
                .opt_i64("answer_ops", pts.iter().map(|p| p.4).collect())
                .build(),
        ],
    );
    // One model trained at ops 4 (run "p" absent from the runs table: not counted).
    let c = data::answer_curves_by_ops(&runs(&[("m", 4)]), &curves).unwrap();
    let labels: Vec<&str> = c.iter().map(|c| c.label.as_str()).collect();
    assert_eq!(labels, ["ops 2", "ops 3", "ops 4"]);
    let pts_of =
        |i: usize| -> Vec<(f64, f64)> { c[i].points.iter().map(|p| (p.0, p.1.mean)).collect() };
    assert_eq!(pts_of(0), [(1000.0, 0.5), (2000.0, 1.0)]);
    assert_eq!(pts_of(1), [(1000.0, 0.375)]);
    assert_eq!(pts_of(2), [(1000.0, 0.25), (2000.0, 0.5)]);
    // With a model trained at ops 2 beside it (an eval row without answer_ops: its own ops),
    // the curves name the model's size; ops 2 has two curves, the ops-2 model's first.
    let c = data::answer_curves_by_ops(&runs(&[("m", 4), ("p", 2)]), &curves).unwrap();
    let labels: Vec<&str> = c.iter().map(|c| c.label.as_str()).collect();
    assert_eq!(
        labels,
        [
            "ops 2 (model ops 2)",
            "ops 2 (model ops 4)",
            "ops 3 (model ops 4)",
            "ops 4 (model ops 4)"
        ]
    );
    assert!(close(c[0].points[0].1.mean, 0.75));
}

#[test]
fn accuracy_vs_examples_has_a_panel_per_setting_and_counts_examples() {
    // Runs: (id, encoding, delta init, min_letters, max_letters, max_shift, min_abs_shift, sign, seed).
    let rows: [(
        &str,
        &str,
        Option<&str>,
        i64,
        i64,
        i64,
        Option<i64>,
        Option<&str>,
        i64,
    ); 6] = [
        ("a", "rope", None, 5, 8, 2, None, None, 0),
        ("b", "rope", None, 5, 8, 2, None, None, 1),
        ("c", "pope", Some("zero"), 5, 8, 2, None, None, 0),
        ("d", "pope", Some("uniform"), 5, 8, 2, None, None, 0),
        ("e", "rope", None, 5, 8, 1, Some(1), Some("positive"), 0),
        ("f", "pope", Some("zero"), 5, 8, 1, Some(1), None, 0),
    ];
    let n = rows.len();
    let runs = Table::from_batches(
        "runs",
        vec![
            TableBuilder::new(n)
                .str("run_id", rows.iter().map(|r| r.0.to_string()).collect())
                .str("status", vec!["done".into(); n])
                .str("encoding", rows.iter().map(|r| r.1.to_string()).collect())
                .opt_str(
                    "pope_delta_init",
                    rows.iter().map(|r| r.2.map(str::to_string)).collect(),
                )
                .i64("min_letters", rows.iter().map(|r| r.3).collect())
                .i64("max_letters", rows.iter().map(|r| r.4).collect())
                .i64("max_shift", rows.iter().map(|r| r.5).collect())
                .opt_i64("min_abs_shift", rows.iter().map(|r| r.6).collect())
                .opt_str(
                    "shift_sign",
                    rows.iter().map(|r| r.7.map(str::to_string)).collect(),
                )
                .i64("seed", rows.iter().map(|r| r.8).collect())
                .i64("batch_size", vec![64; n])
                .i64("d_model", vec![64; n])
                .build(),
        ],
    );
    // Curves: steps 0, 100, 200 per run, accuracy = step / 1000 + seed / 10; run a's final
    // evaluation written twice (it must count once); one train row (ignored).
    let mut c: Vec<(String, &str, i64, f64)> = Vec::new();
    for r in &rows {
        for step in [0i64, 100, 200] {
            c.push((
                r.0.into(),
                "eval",
                step,
                step as f64 / 1000.0 + r.8 as f64 / 10.0,
            ));
        }
    }
    c.push(("a".into(), "eval", 200, 0.2));
    c.push(("a".into(), "train", 200, 0.9));
    let m = c.len();
    let curves = Table::from_batches(
        "curves",
        vec![
            TableBuilder::new(m)
                .str("run_id", c.iter().map(|r| r.0.clone()).collect())
                .str("split", c.iter().map(|r| r.1.to_string()).collect())
                .i64("step", c.iter().map(|r| r.2).collect())
                .f64("accuracy", c.iter().map(|r| r.3).collect())
                .build(),
        ],
    );
    let panels = data::accuracy_vs_examples(&runs, &curves).unwrap();
    let titles: Vec<&str> = panels.iter().map(|p| p.setting.as_str()).collect();
    // d_model is the same in every run: not in the titles. Run f's null sign is "both".
    assert_eq!(
        titles,
        [
            "5–8 letters, k = +1",
            "5–8 letters, |k| = 1",
            "5–8 letters, |k| ≤ 2"
        ]
    );
    let wide = &panels[2];
    let labels: Vec<&str> = wide.curves.iter().map(|c| c.label.as_str()).collect();
    assert_eq!(labels, ["rope", "pope", "pope δ-uniform"]);
    let rope = &wide.curves[0];
    // Step 0 is left out (log axis); x = step × 64 / 1000 examples.
    let xs: Vec<f64> = rope.points.iter().map(|p| p.0).collect();
    assert_eq!(xs, [6.4, 12.8]);
    // Seeds 0 and 1 at step 200: 0.2 and 0.3 (run a's duplicate not counted twice).
    assert_eq!(rope.points[1].1.values.len(), 2);
    assert!(close(rope.points[1].1.mean, 0.25));
    assert_eq!(panels[0].curves.len(), 1);
    assert_eq!(panels[0].curves[0].label, "rope");
}

/// A synthetic `mi.parquet` in the MI-profile sweep's schema: MI(lag) = a · lag_chars^(−1/2)
/// for two granularities of corpus `synthetic` with 1 and 4 characters per token, so the
/// rescaled curves coincide; with `with_task`, also a task profile (`task:block-copy-B8`: MI at
/// multiples of 8 only), which goes to its own figure, `mi-tasks`.
fn write_mi(dir: &Path, with_task: bool) {
    // (corpus, granularity, lag, lag_chars, mutual_info, significant)
    let mut rows = Vec::new();
    for (g, cpt) in [("char", 1.0), ("bpe-4", 4.0)] {
        for lag in [1i64, 2, 4, 8, 16] {
            let chars = lag as f64 * cpt;
            rows.push(("synthetic", g, lag, chars, 0.5 / chars.sqrt(), lag < 16));
        }
    }
    if with_task {
        for lag in 1..=24i64 {
            let peak = lag % 8 == 0;
            let info = if peak { 2.0 } else { 0.003 };
            rows.push(("task:block-copy-B8", "token", lag, lag as f64, info, peak));
        }
    }
    let n = rows.len();
    let b = TableBuilder::new(n)
        .str("corpus", rows.iter().map(|r| r.0.to_string()).collect())
        .str(
            "granularity",
            rows.iter().map(|r| r.1.to_string()).collect(),
        )
        .i64("lag", rows.iter().map(|r| r.2).collect())
        .f64("lag_chars", rows.iter().map(|r| r.3).collect())
        .f64("mutual_info", rows.iter().map(|r| r.4).collect())
        .f64("mi_shuffle_hi", vec![0.01; n])
        .bool("significant", rows.iter().map(|r| r.5).collect())
        .build();
    write_batch(&dir.join("mi.parquet"), &b).unwrap();
}

#[test]
fn mi_profiles_read_the_schema_and_collapse_when_rescaled() {
    let dir = tmp("mi");
    write_mi(&dir, false);
    let profiles = data::mi_profiles(&Table::read(&dir.join("mi.parquet")).unwrap()).unwrap();
    let names: Vec<&str> = profiles.iter().map(|p| p.granularity.as_str()).collect();
    assert_eq!(names, ["bpe-4", "char"]);
    let (bpe, ch) = (&profiles[0], &profiles[1]);
    assert_eq!(bpe.points[0], (1.0, 4.0, 0.25, true));
    assert!(!bpe.points[4].3, "lag 16 is not significant");
    // Same character distance → same MI: bpe lag 1 (4 chars) = char lag 4.
    assert!(close(bpe.points[0].2, ch.points[2].2));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ticks_and_labels() {
    assert_eq!(log_ticks(0.03, 1.2), vec![0.05, 0.1, 0.2, 0.5, 1.0]);
    assert_eq!(log_ticks(1e-4, 1.0).len(), 13);
    assert_eq!(
        log_ticks(0.12, 0.35),
        vec![0.2, 0.3],
        "fewer than 3 from 1-2-5: 1..9"
    );
    assert_eq!(pow2_ticks(3.0, 70.0), vec![4.0, 8.0, 16.0, 32.0, 64.0]);
    assert_eq!(fmt_num(0.05), "0.05");
    assert_eq!(fmt_num(64.0), "64");
    assert_eq!(fmt_num(1e-4), "10⁻⁴");
    assert_eq!(fmt_num(2e-4), "2×10⁻⁴");
}

fn png_size(path: &Path) -> (u32, u32) {
    let b = std::fs::read(path).unwrap();
    assert_eq!(&b[1..4], b"PNG", "{} is not a PNG", path.display());
    let be = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    (be(16), be(20))
}

/// Writes the tables every sweep's figures read, from the hand-made rows above.
fn write_all_tables(dir: &Path) {
    // block-width: 2 seeds × 3 widths, on the law; 2 pairs; one layer.
    let mut runs = Vec::new();
    let mut spec = Vec::new();
    for seed in [0i64, 1] {
        for w in [4i64, 16, 64] {
            let id = format!("s{seed}w{w}");
            runs.push((id.clone(), w, seed));
            for h in 0..2 {
                spec.push((id.clone(), h, 0, 1.0, if w == 4 { 0.9 } else { 0.2 }));
                spec.push((id.clone(), h, 1, 0.01, if w == 4 { 0.1 } else { 0.8 }));
            }
        }
    }
    let n = runs.len();
    let rb = TableBuilder::new(n)
        .str("run_id", runs.iter().map(|r| r.0.clone()).collect())
        .str("status", vec!["done".into(); n])
        .str("encoding", vec!["rope".into(); n])
        .str("variant", vec!["copy".into(); n])
        .i64("dep_width", runs.iter().map(|r| r.1).collect())
        .i64("seed", runs.iter().map(|r| r.2).collect())
        .i64("ops", runs.iter().map(|r| r.1).collect())
        .i64("batch_size", vec![64; n])
        .opt_f64(
            "effective_freq",
            runs.iter().map(|r| Some(PI / r.1 as f64)).collect(),
        )
        .opt_f64("final_eval_accuracy", vec![Some(0.5); n])
        .opt_f64("answer_accuracy", vec![Some(0.25); n])
        .build();
    write_batch(&dir.join("runs.parquet"), &rb).unwrap();
    // indirect-indexing's attention figure: one layer, two heads per run.
    let mut att = Vec::new();
    for r in &runs {
        for h in 0..2i64 {
            for (role, share) in [
                ("source", 0.6),
                ("target", 0.1),
                ("query", 0.1),
                ("other_letter", 0.2),
            ] {
                att.push((r.0.clone(), h, role, share));
            }
        }
    }
    let ab = TableBuilder::new(att.len())
        .str("run_id", att.iter().map(|r| r.0.clone()).collect())
        .i64("layer", vec![0; att.len()])
        .i64("head", att.iter().map(|r| r.1).collect())
        .str("role", att.iter().map(|r| r.2.to_string()).collect())
        .f64("share", att.iter().map(|r| r.3).collect())
        .build();
    write_batch(&dir.join("attention.parquet"), &ab).unwrap();
    let m = spec.len();
    let sb = TableBuilder::new(m)
        .str("run_id", spec.iter().map(|r| r.0.clone()).collect())
        .i64("step", vec![40; m])
        .i64("layer", vec![0; m])
        .i64("head", spec.iter().map(|r| r.1).collect())
        .i64("freq_index", spec.iter().map(|r| r.2).collect())
        .f64("theta", spec.iter().map(|r| r.3).collect())
        .f64("energy_frac", spec.iter().map(|r| r.4).collect())
        .build();
    write_batch(&dir.join("spectrum.parquet"), &sb).unwrap();
    let cb = TableBuilder::new(2 * n)
        .str(
            "run_id",
            runs.iter()
                .flat_map(|r| [r.0.clone(), r.0.clone()])
                .collect(),
        )
        .str("split", vec!["eval".into(); 2 * n])
        .i64("step", (0..2 * n).map(|i| 20 * (i % 2) as i64).collect())
        .f64(
            "accuracy",
            (0..2 * n).map(|i| 0.1 + 0.4 * (i % 2) as f64).collect(),
        )
        .build();
    write_batch(&dir.join("curves.parquet"), &cb).unwrap();
    let mut rows = pi_rows();
    // The block-width ablation: one run evaluated unablated and with each band at θ = 0.
    for acc in [0.95, 0.2, 0.9] {
        rows.push((
            "ablation", "block", "copy", "rope", 1.0, "none", acc, 32, 32, 1.0,
        ));
    }
    let e = rows.len();
    let band = |i: usize| match i.checked_sub(e - 3) {
        Some(0) => "",
        Some(1) => "law",
        Some(_) => "far",
        None => "",
    };
    let eb = TableBuilder::new(e)
        .str(
            "run_id",
            (0..e)
                .map(|i| {
                    if i + 3 >= e {
                        "abl".into()
                    } else {
                        format!("e{i}")
                    }
                })
                .collect(),
        )
        .i64("block_len", vec![8; e])
        .str("ablate_band", (0..e).map(|i| band(i).to_string()).collect())
        .str(
            "corpus",
            (0..e)
                .map(|i| ["shakespeare", "ecoli"][i % 2].to_string())
                .collect(),
        )
        .str("eval_name", rows.iter().map(|r| r.0.to_string()).collect())
        .str("task", rows.iter().map(|r| r.1.to_string()).collect())
        // As the lab writes it (schema 2): `variant` is null for rows of other tasks than block.
        .opt_str(
            "variant",
            rows.iter()
                .map(|r| (r.1 == "block").then(|| r.2.to_string()))
                .collect(),
        )
        .str("encoding", rows.iter().map(|r| r.3.to_string()).collect())
        .f64("length_ratio", rows.iter().map(|r| r.4).collect())
        .str("scaling", rows.iter().map(|r| r.5.to_string()).collect())
        .f64("accuracy", rows.iter().map(|r| r.6).collect())
        .i64("seq_len", rows.iter().map(|r| r.7).collect())
        .i64("train_seq_len", rows.iter().map(|r| r.8).collect())
        .f64("loss", rows.iter().map(|r| r.9).collect())
        .build();
    write_batch(&dir.join("evals.parquet"), &eb).unwrap();
    write_mi(dir, true);
}

#[test]
fn every_sweep_writes_its_figures_as_png_and_svg() {
    if lab::plot::find_font().is_none() {
        panic!("no font: install fonts-dejavu-core (the CI script does) or set LAB_FONT");
    }
    let dir = tmp("all");
    write_all_tables(&dir);
    for (sweep, figures) in SWEEP_FIGURES {
        let out = dir.join("figures").join(sweep);
        let written = plot_sweep(sweep, &dir, &out).unwrap_or_else(|e| panic!("{sweep}: {e}"));
        let expect: Vec<PathBuf> = figures
            .iter()
            .flat_map(|f| [out.join(format!("{f}.png")), out.join(format!("{f}.svg"))])
            .collect();
        assert_eq!(written, expect, "{sweep}");
        for f in &written {
            let meta = std::fs::metadata(f).unwrap();
            assert!(
                meta.len() > 2000,
                "{} is only {} bytes",
                f.display(),
                meta.len()
            );
        }
        let (w, h) = png_size(&written[0]);
        assert!(w >= 700 && h >= 500, "{sweep}: {w}×{h}");
        // No temporaries left behind.
        let left: Vec<_> = std::fs::read_dir(&out)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
    let svg = |sweep: &str, f: &str| {
        std::fs::read_to_string(dir.join("figures").join(sweep).join(format!("{f}.svg"))).unwrap()
    };
    let law = svg("block-width", "theta-eff-vs-width");
    assert!(law.contains("π/W"), "reference line in the legend");
    assert!(law.contains("β = 1.00"), "the exact law is fitted");
    assert!(law.contains("θ_eff (rad/token)"));
    assert!(svg("block-width", "spectrum-heatmap").contains("block width B (tokens)"));
    let ablation = svg("block-width", "ablation");
    assert!(ablation.contains("π/B band at θ = 0") && ablation.contains("B = 8"));
    assert!(svg("indirect-indexing", "accuracy-by-encoding").contains("chance (1/52)"));
    let attention = svg("indirect-indexing", "attention");
    assert!(attention.contains("L0h1") && attention.contains("answer letter"));
    assert!(svg("pi-self-similarity", "pi-accuracy").contains("fixed · igsm"));
    assert!(svg("length-extrapolation", "nll-vs-length").contains("training length 32"));
    let real = svg("real-sequences", "real-sequences-nll");
    assert!(
        real.contains("shakespeare") && real.contains("ecoli"),
        "one panel per corpus"
    );
    assert!(real.contains("held-out NLL (nats per token)"));
    let corpora = svg("mi-profiles", "mi-profiles");
    assert!(
        corpora.contains("bpe-4") && !corpora.contains("task:"),
        "corpora only"
    );
    let tasks = svg("mi-profiles", "mi-tasks");
    assert!(tasks.contains("task:block-copy-B8: raw lag") && !tasks.contains("rescaled"));
    assert!(
        !tasks.contains("\ntoken\n"),
        "no legend for one profile per panel"
    );
    assert!(
        corpora.contains("\nchar\n"),
        "a legend where granularities share a panel"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_input_is_one_clear_error() {
    let dir = tmp("bad");
    let e = plot_sweep("no-such-sweep", &dir, &dir.join("f")).unwrap_err();
    assert!(matches!(e, PlotError::UnknownSweep { .. }));
    assert!(
        e.to_string().contains("block-width, indirect-indexing"),
        "{e}"
    );
    let e = plot_sweep("block-width", &dir, &dir.join("f")).unwrap_err();
    assert!(e.to_string().contains("runs.parquet not found"), "{e}");
    // A table without a needed column names it.
    let b = TableBuilder::new(1).str("run_id", s(&["x"])).build();
    write_batch(&dir.join("runs.parquet"), &b).unwrap();
    let e = plot_sweep("indirect-indexing", &dir, &dir.join("f")).unwrap_err();
    assert!(e.to_string().contains("no column `encoding`"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Real-sequences curves keep each corpus's rows apart: hand-made losses, two corpora, RoPE
/// unscaled and PI at 2×, two seeds.
#[test]
fn length_curves_per_corpus_use_only_that_corpus() {
    // (corpus, scaling, seq_len, loss, seed)
    let rows = [
        ("prose", "none", 64, 1.0, 0),
        ("prose", "none", 64, 2.0, 1),
        ("prose", "linear", 128, 3.0, 0),
        ("prose", "linear", 128, 5.0, 1),
        ("dna", "none", 64, 10.0, 0),
        ("dna", "linear", 128, 20.0, 0),
    ];
    let n = rows.len();
    let b = TableBuilder::new(n)
        .str("corpus", rows.iter().map(|r| r.0.to_string()).collect())
        .str("encoding", vec!["rope".into(); n])
        .str("scaling", rows.iter().map(|r| r.1.to_string()).collect())
        .i64("seq_len", rows.iter().map(|r| r.2).collect())
        .i64("train_seq_len", vec![64; n])
        .f64("loss", rows.iter().map(|r| r.3).collect())
        .i64("seed", rows.iter().map(|r| r.4).collect())
        .build();
    let evals = Table::from_batches("evals", vec![b]);
    let (curves, trains) = data::length_curves_where(&evals, "loss", Some("prose")).unwrap();
    assert_eq!(trains, [64]);
    assert_eq!(curves.len(), 1, "{curves:?}");
    assert_eq!(curves[0].label, "rope + linear");
    let pts: Vec<(f64, f64, f64, f64)> = curves[0]
        .points
        .iter()
        .map(|(x, s)| (*x, s.mean, s.min, s.max))
        .collect();
    // 64: the unscaled training-length point (shared by every scaling), mean of 1 and 2.
    assert_eq!(pts, [(64.0, 1.5, 1.0, 2.0), (128.0, 4.0, 3.0, 5.0)]);
    let (dna, _) = data::length_curves_where(&evals, "loss", Some("dna")).unwrap();
    assert_eq!(dna[0].points[1].1.mean, 20.0);
    let (all, _) = data::length_curves(&evals, "loss").unwrap();
    assert_eq!(
        all[0].points[1].1.values.len(),
        3,
        "no filter: both corpora"
    );
}

/// `lab plot NAME` on another sweep's folder is refused by name instead of drawing NAME's
/// figures from the wrong runs (issue 16: igsm-ops on a block-width folder spun forever,
/// indirect-indexing drew a wrong figure); a sweep file without figures of its own passes.
#[test]
fn plot_refuses_another_sweeps_results() {
    let dir = tmp("wrong-sweep");
    let runs = |sweep: &str| {
        TableBuilder::new(1)
            .str("run_id", vec!["a".into()])
            .str("sweep", vec![sweep.into()])
            .str("status", vec!["done".into()])
            .build()
    };
    write_batch(&dir.join("runs.parquet"), &runs("block-width")).unwrap();
    for wanted in ["igsm-ops", "indirect-indexing"] {
        let err = plot_sweep(wanted, &dir, &dir.join("figures")).unwrap_err();
        assert!(matches!(err, PlotError::WrongSweep { .. }), "{err}");
        assert_eq!(
            err.to_string(),
            format!(
                "{} holds runs of sweep block-width, not {wanted}: name sweep block-width instead, or pass the results folder of sweep {wanted} with --results (default <lab root>/results/{wanted})",
                dir.display()
            )
        );
        // `lab report` refuses the same folder (issue 51, item 6: it wrote indirect-indexing's
        // claim over block-width's fits and exited 0).
        let page = dir.join("report.html");
        let err =
            lab::report::write_report(wanted, &dir, &page, &lab::sweep::sweeps_dir()).unwrap_err();
        assert!(
            err.to_string().starts_with(&format!(
                "{} holds runs of sweep block-width, not {wanted}",
                dir.display()
            )),
            "{err}"
        );
        assert!(!page.exists(), "no page written");
    }
    assert!(!dir.join("figures").exists(), "nothing drawn");
    // A new experiment's own sweep name: not refused by this check (it fails later, on the
    // missing tables of this synthetic folder, not on the sweep name).
    write_batch(&dir.join("runs.parquet"), &runs("my-encodings")).unwrap();
    let err = plot_sweep("block-width", &dir, &dir.join("figures")).unwrap_err();
    assert!(!matches!(err, PlotError::WrongSweep { .. }), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Axis ranges from degenerate data (no point, one point, NaN, infinities) are drawable: the
/// figure is written instead of plotters spinning on its key points (issue 16).
#[test]
fn degenerate_data_draws_instead_of_hanging() {
    use lab::plot::draw::{LinePanel, LinesPlot, safe_range};
    assert_eq!(
        safe_range(f64::INFINITY, f64::NEG_INFINITY, (0.0, 1.0)),
        (0.0, 1.0)
    );
    assert_eq!(safe_range(f64::NAN, 2.0, (0.0, 1.0)), (0.0, 1.0));
    assert_eq!(safe_range(4.0, 4.0, (0.0, 1.0)), (2.0, 6.0));
    assert_eq!(safe_range(0.0, 0.0, (0.0, 1.0)), (-0.5, 0.5));
    assert_eq!(safe_range(1.0, 3.0, (0.0, 1.0)), (1.0, 3.0));
    use lab::plot::draw::safe_log_range;
    assert_eq!(safe_log_range(0.5, 8.0), (0.5, 8.0));
    assert_eq!(safe_log_range(0.0, 8.0), (4.0, 16.0));
    assert_eq!(safe_log_range(f64::NAN, f64::NAN), (0.1, 10.0));
    if lab::plot::find_font().is_none() {
        panic!("no font: install fonts-dejavu-core (the CI script does) or set LAB_FONT");
    }
    let dir = tmp("degenerate");
    let (tx, rx) = std::sync::mpsc::channel();
    let out = dir.clone();
    std::thread::spawn(move || {
        let stat = |v: f64| data::Stat::of(vec![v]).unwrap();
        let panel = |points: Vec<(f64, data::Stat)>, log2_x| LinePanel {
            title: "t".into(),
            x_desc: "x".into(),
            y_desc: "y".into(),
            curves: vec![data::Curve {
                label: "rope".into(),
                points,
            }],
            log2_x,
            percent_y: false,
            vlines: vec![],
            legend: None,
        };
        let fig = LinesPlot {
            title: "degenerate".into(),
            panels: vec![
                panel(vec![], false),
                panel(vec![(64.0, stat(0.5))], true),
                panel(
                    vec![(1.0, stat(f64::NAN)), (2.0, stat(f64::INFINITY))],
                    false,
                ),
                panel(vec![(0.0, stat(1.0)), (0.0, stat(1.0))], true),
            ],
            note: String::new(),
        };
        lab::plot::register_font().unwrap();
        tx.send(lab::plot::save(&fig, &out, "degenerate").map(|w| w.len()))
            .unwrap();
    });
    let written = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("drawing degenerate data did not finish in 60 s");
    assert_eq!(written.unwrap(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The attention figure's panels: one per encoding × the settings that differ, groups (layer, head)
/// as `layer · 64 + head`, bars = roles in `ATTENTION_ROLES` order, means over seeds; `rest` and
/// unfinished runs are left out.
#[test]
fn attention_panels_average_seeds_per_encoding_and_shape() {
    let runs = TableBuilder::new(4)
        .str("run_id", s(&["a", "b", "c", "x"]))
        .str("status", s(&["done", "done", "done", "failed"]))
        .str("encoding", s(&["rope", "rope", "pope", "rope"]))
        .i64("n_heads", vec![2, 2, 8, 2])
        .i64("d_model", vec![64, 64, 64, 64])
        .i64("seed", vec![0, 1, 0, 2])
        .opt_str(
            "pope_delta_init",
            vec![None, None, Some("uniform".into()), None],
        )
        .build();
    let runs = Table::from_batches("runs", vec![runs]);
    let rows: Vec<(&str, i64, i64, &str, f64)> = vec![
        ("a", 1, 0, "target", 0.8),
        ("b", 1, 0, "target", 0.4),
        ("a", 1, 0, "rest", 0.2),
        ("c", 0, 3, "source", 0.5),
        ("x", 0, 0, "target", 1.0),
    ];
    let at = TableBuilder::new(rows.len())
        .str("run_id", rows.iter().map(|r| r.0.to_string()).collect())
        .i64("layer", rows.iter().map(|r| r.1).collect())
        .i64("head", rows.iter().map(|r| r.2).collect())
        .str("role", rows.iter().map(|r| r.3.to_string()).collect())
        .f64("share", rows.iter().map(|r| r.4).collect())
        .build();
    let at = Table::from_batches("attention", vec![at]);
    let panels = data::attention_panels(&at, &runs).unwrap();
    let titles: Vec<&str> = panels.iter().map(|p| p.title.as_str()).collect();
    // RoPE before PoPE (the lab's encoding order); n_heads and δ's initialisation differ among
    // finished runs (a setting a run does not have is left out of its title).
    assert_eq!(
        titles,
        ["rope n_heads=2", "pope n_heads=8 pope_delta_init=uniform"]
    );
    assert_eq!(panels[0].ratios, vec![64.0]); // layer 1, head 0
    assert_eq!(panels[1].ratios, vec![3.0]); // layer 0, head 3
    let target = panels[0].cells[0][1].as_ref().unwrap();
    assert!(close(target.mean, 0.6) && close(target.min, 0.4) && close(target.max, 0.8));
    assert!(
        panels[0].cells[0][0].is_none(),
        "no source row for runs a, b"
    );
    assert!(close(panels[1].cells[0][0].as_ref().unwrap().mean, 0.5));
    assert_eq!(panels[0].labels.len(), data::ATTENTION_ROLES.len());
}

/// The main iGSM figure: each run's own `ops` from `runs`, the other sizes of the same model from
/// its unscaled 1× evaluations (`config_json`'s `task.ops`); scaled, longer and ablated
/// evaluations are left out; runs trained at several `ops` get a curve per model size.
#[test]
fn igsm_by_ops_adds_the_sizes_a_model_was_evaluated_on() {
    let runs = igsm_runs;
    let json = |ops: i64| format!(r#"{{"task":{{"kind":"igsm","ops":{ops}}},"seq_len":144}}"#);
    // (run, length_ratio, scaling, ablate_band ("" or null: none), eval ops, answer accuracy)
    let rows: [(&str, f64, &str, Option<&str>, i64, f64); 7] = [
        ("m0", 1.0, "none", Some(""), 2, 1.0),
        ("m0", 1.0, "none", Some(""), 2, 0.0),
        ("m1", 1.0, "none", None, 2, 0.5),
        ("m0", 1.0, "none", Some(""), 3, 0.75),
        ("m0", 2.0, "linear", Some(""), 2, 0.0),
        ("m0", 1.0, "none", Some("near"), 2, 0.0),
        ("m0", 1.0, "none", None, 4, 0.0),
    ];
    let evals = Table::from_batches(
        "evals",
        vec![
            TableBuilder::new(rows.len())
                .str("run_id", rows.iter().map(|r| r.0.to_string()).collect())
                .f64("length_ratio", rows.iter().map(|r| r.1).collect())
                .str("scaling", rows.iter().map(|r| r.2.to_string()).collect())
                .opt_str(
                    "ablate_band",
                    rows.iter().map(|r| r.3.map(str::to_string)).collect(),
                )
                .str("config_json", rows.iter().map(|r| json(r.4)).collect())
                .opt_f64("answer_accuracy", rows.iter().map(|r| Some(r.5)).collect())
                .build(),
        ],
    );
    let two_seeds = runs(&[("m0", 4, 0.5), ("m1", 4, 0.25)]);
    let c = data::igsm_by_ops(&two_seeds, Some(&evals), "answer_accuracy").unwrap();
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].label, "rope");
    let pts: Vec<(f64, f64, usize)> = c[0]
        .points
        .iter()
        .map(|p| (p.0, p.1.mean, p.1.values.len()))
        .collect();
    // ops 2: 1.0 and 0.5 (m0's repeat, the 2× PI and the ablated rows left out); ops 3: m0 only; ops 4: the
    // runs' own (the 1× evaluation at the run's own ops is not counted twice).
    assert_eq!(pts, [(2.0, 0.75, 2), (3.0, 0.75, 1), (4.0, 0.375, 2)]);
    // Without evaluations: the runs' own ops only.
    let c = data::igsm_by_ops(&two_seeds, None, "answer_accuracy").unwrap();
    assert_eq!(c[0].points.len(), 1);
    // A model trained at ops 2 beside them: one curve per model size.
    let mixed = runs(&[("m0", 4, 0.5), ("m1", 4, 0.25), ("p", 2, 0.125)]);
    let c = data::igsm_by_ops(&mixed, Some(&evals), "answer_accuracy").unwrap();
    let labels: Vec<&str> = c.iter().map(|c| c.label.as_str()).collect();
    assert_eq!(labels, ["rope, model ops 2", "rope, model ops 4"]);
    assert_eq!(c[0].points.len(), 1);
    assert!(close(c[0].points[0].1.mean, 0.125));
}

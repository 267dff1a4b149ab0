//! The end-of-sweep analysis of the frequency law (SCIENCE.md §5, §8; rules in
//! docs/analysis-rules.md): per-run records from the merged tables, fits of
//! `ln θ_eff = ln c − β ln W` per (encoding, variant, pooling, width source), the causal check's
//! ablation table, and the printed summary.
//!
//! Poolings (R1): `positional` (the layer chosen by R2, printed first), `all` (every layer and
//! head, the run's `effective_freq`), `layer:<l>`. Width sources (R4): `dep_width` (`W = B` for
//! the block task) and `mi` (the width of the run's training data from its MI profile).

use std::collections::BTreeMap;
use std::path::Path;

use crate::analysis::{FitPoint, RunSetting, fit_law, setting_labels};
use crate::model::Encoding;
use crate::results::tables::FitRow;
use crate::results::{self, ResultsError, column};

/// What the summary needs of one run (read from `runs.parquet`, `layers.parquet`, `evals.parquet`).
#[derive(Clone, Debug, Default)]
pub struct RunRecord {
    /// Run id.
    pub id: String,
    /// `done` or `failed`.
    pub status: String,
    /// Encoding name.
    pub encoding: String,
    /// Block variant, or the task name for other tasks.
    pub variant: String,
    /// `dep_width` (B for the block task).
    pub block_len: i64,
    /// Base, context, layout and encoding options (what the fit groups tell apart).
    pub setting: RunSetting,
    /// Seed.
    pub seed: i64,
    /// Final accuracy (iGSM: generated-answer accuracy).
    pub acc: Option<f64>,
    /// Final held-out (test) loss, nats per scored token.
    pub loss: Option<f64>,
    /// Pooled θ_eff (`all`).
    pub theta: Option<f64>,
    /// θ_eff of the positional layer.
    pub theta_positional: Option<f64>,
    /// The positional layer.
    pub positional_layer: Option<i64>,
    /// θ_eff per layer at the final evaluation (index = layer).
    pub theta_layers: Vec<Option<f64>>,
    /// Per layer at the end: (lag with the most attention, its share, share at lags < W).
    pub attention: Vec<Option<(i64, f64, f64)>>,
    /// W from the MI profile of the run's data.
    pub dep_width_mi: Option<i64>,
    /// Steps trained.
    pub steps_done: Option<i64>,
    /// Where the spectrum converged (`None`: cap reached or not a spectrum stop).
    pub converged_step: Option<i64>,
    /// Whether the run stops on the spectrum (`stop = "spectrum"`), else after `steps`.
    pub spectrum_stop: bool,
    /// Spectrum entropy at initialisation and at the end, nats.
    pub entropy_init: Option<f64>,
    /// See `entropy_init`.
    pub entropy: Option<f64>,
    /// Ablation: (accuracy, loss) unablated, and with the law and far bands at θ = 0.
    pub ablation: Ablations,
}

impl RunRecord {
    /// The run's window layer (docs/analysis-rules.md R15): the layer with the largest
    /// attention share at lags `0 … W − 1` at the final evaluation (`attn_mass_in_window`);
    /// ties go to the lower layer; in hybrid models the NoPE layers are not candidates. `None`
    /// when no layer has an attention profile.
    pub fn window_layer(&self) -> Option<usize> {
        let every = self.setting.nope_every.unwrap_or(0).max(0) as usize;
        let mut best: Option<(usize, f64)> = None;
        for (l, a) in self.attention.iter().enumerate() {
            let Some((_, _, in_window)) = a else { continue };
            if every > 0 && (l + 1) % every == 0 {
                continue;
            }
            if best.is_none_or(|(_, m)| *in_window > m) {
                best = Some((l, *in_window));
            }
        }
        best.map(|(l, _)| l)
    }
}

/// The causal check of one run (docs/analysis-rules.md, R5): `(accuracy, loss)` per evaluation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ablations {
    /// Unablated evaluation of the same `[[evals]]` entry.
    pub base: Option<(f64, f64)>,
    /// Law band at θ = 0.
    pub law: Option<(f64, f64)>,
    /// Far band at θ = 0.
    pub far: Option<(f64, f64)>,
}

impl Ablations {
    /// Accuracy lost by ablating the law band and the far band (`base − ablated`), when both
    /// were measured.
    pub fn drops(&self) -> Option<(f64, f64)> {
        let (b, l, f) = (self.base?, self.law?, self.far?);
        Some((b.0 - l.0, b.0 - f.0))
    }
}

/// Read the records of the runs in `out_dir`'s merged tables whose id is in `ids`.
///
/// # Errors
/// [`ResultsError`] when a merged table exists but cannot be read.
pub fn read_records(out_dir: &Path, ids: &[String]) -> Result<Vec<RunRecord>, ResultsError> {
    let mut records = Vec::new();
    if !out_dir.join("runs.parquet").is_file() {
        return Ok(records);
    }
    let (_, batches) = results::read_parquet(&out_dir.join("runs.parquet"))?;
    for b in &batches {
        let s = |c: &str| column::strings(b, c);
        let f = |c: &str| column::floats(b, c);
        let i = |c: &str| column::ints(b, c);
        let (id, status, enc, var, task) = (
            s("run_id"),
            s("status"),
            s("encoding"),
            s("variant"),
            s("task"),
        );
        let stop = s("stop");
        let (base, len, layout) = (f("rope_base"), i("seq_len"), s("pair_layout"));
        let (rope_p, rotary_dim, nope_every) = (f("rope_p"), i("rotary_dim"), i("nope_every"));
        let n_layers = i("n_layers");
        let (bl, seed, pl, wmi, sd, cs) = (
            i("dep_width"),
            i("seed"),
            i("positional_layer"),
            i("dep_width_mi"),
            i("steps_done"),
            i("converged_step"),
        );
        let test_loss = f("final_eval_loss");
        let (acc, answer, th, thp, e0, e1) = (
            f("final_eval_accuracy"),
            f("answer_accuracy"),
            f("effective_freq"),
            f("effective_freq_positional"),
            f("spectrum_entropy_init"),
            f("spectrum_entropy"),
        );
        for r in 0..b.num_rows() {
            records.push(RunRecord {
                id: id[r].clone().unwrap_or_default(),
                status: status[r].clone().unwrap_or_default(),
                encoding: enc[r].clone().unwrap_or_default(),
                variant: match task[r].as_deref() {
                    Some("block") | None => var[r].clone().unwrap_or_default(),
                    Some(other) => other.to_string(),
                },
                block_len: bl[r].unwrap_or(0),
                setting: RunSetting {
                    rope_base: base[r].unwrap_or(0.0),
                    seq_len: len[r].unwrap_or(0),
                    pair_layout: layout[r].clone().unwrap_or_default(),
                    rope_p: rope_p[r],
                    rotary_dim: rotary_dim[r],
                    nope_every: nope_every[r],
                    n_layers: n_layers[r].unwrap_or(0),
                },
                seed: seed[r].unwrap_or(0),
                // iGSM: the generated-answer accuracy (teacher-forced answer tokens are a copy).
                acc: answer[r].or(acc[r]),
                loss: test_loss[r],
                theta: th[r],
                theta_positional: thp[r],
                positional_layer: pl[r],
                theta_layers: Vec::new(),
                attention: Vec::new(),
                dep_width_mi: wmi[r],
                steps_done: sd[r],
                converged_step: cs[r],
                spectrum_stop: stop[r].as_deref() == Some("spectrum"),
                entropy_init: e0[r],
                entropy: e1[r],
                ablation: Ablations::default(),
            });
        }
    }
    let wanted: std::collections::HashSet<&str> = ids.iter().map(|s| s.as_str()).collect();
    records.retain(|r| wanted.contains(r.id.as_str()));
    let index: BTreeMap<String, usize> = records
        .iter()
        .enumerate()
        .map(|(k, r)| (r.id.clone(), k))
        .collect();
    if out_dir.join("layers.parquet").is_file() {
        let (_, batches) = results::read_parquet(&out_dir.join("layers.parquet"))?;
        for b in &batches {
            let id = column::strings(b, "run_id");
            let layer = column::ints(b, "layer");
            let th = column::floats(b, "effective_freq");
            let fin = column::bools(b, "is_final");
            let (top, mass, window) = (
                column::ints(b, "attn_top_lag"),
                column::floats(b, "attn_top_lag_mass"),
                column::floats(b, "attn_mass_in_window"),
            );
            for r in 0..b.num_rows() {
                let (Some(id), Some(l), Some(true)) = (&id[r], layer[r], fin[r]) else {
                    continue;
                };
                if let Some(&k) = index.get(id) {
                    let l = l as usize;
                    let rec = &mut records[k];
                    if rec.theta_layers.len() <= l {
                        rec.theta_layers.resize(l + 1, None);
                        rec.attention.resize(l + 1, None);
                    }
                    rec.theta_layers[l] = th[r];
                    rec.attention[l] = match (top[r], mass[r], window[r]) {
                        (Some(t), Some(m), Some(w)) => Some((t, m, w)),
                        _ => None,
                    };
                }
            }
        }
    }
    if out_dir.join("evals.parquet").is_file() {
        // (run, eval name) → band → (accuracy, loss), at the training length without scaling.
        // Only an `[[evals]]` entry that ablated something provides the baseline, so a plain
        // `lab eval` row (`adhoc`, maybe with other task settings) never stands in for it.
        type Entry = BTreeMap<String, (f64, f64)>;
        let mut entries: BTreeMap<(String, String), Entry> = BTreeMap::new();
        let (_, batches) = results::read_parquet(&out_dir.join("evals.parquet"))?;
        for b in &batches {
            let id = column::strings(b, "run_id");
            let name = column::strings(b, "eval_name");
            let band = column::strings(b, "ablate_band");
            let ratio = column::floats(b, "length_ratio");
            let scaling = column::strings(b, "scaling");
            let (acc, loss) = (column::floats(b, "accuracy"), column::floats(b, "loss"));
            for r in 0..b.num_rows() {
                let (Some(id), Some(n), Some(bd), Some(a), Some(l)) =
                    (&id[r], &name[r], &band[r], acc[r], loss[r])
                else {
                    continue;
                };
                if ratio[r] != Some(1.0) || scaling[r].as_deref().is_some_and(|s| s != "none") {
                    continue;
                }
                entries
                    .entry((id.clone(), n.clone()))
                    .or_default()
                    .insert(bd.clone(), (a, l));
            }
        }
        for ((id, _), bands) in entries {
            let Some(&k) = index.get(&id) else { continue };
            if !bands.contains_key("law") && !bands.contains_key("far") {
                continue;
            }
            records[k].ablation = Ablations {
                base: bands.get("").copied(),
                law: bands.get("law").copied(),
                far: bands.get("far").copied(),
            };
        }
    }
    drop_tapa_theta(&mut records);
    Ok(records)
}

/// TAPA's spectrum centroid is a phase frequency in radians per unit of `|m − n|^α`, not per
/// token (docs/analysis-rules.md R59): its records get no θ_eff (pooled, positional or per layer)
/// beside the rotary encodings'.
fn drop_tapa_theta(records: &mut [RunRecord]) {
    for r in records.iter_mut().filter(|r| r.encoding == TAPA) {
        r.theta = None;
        r.theta_positional = None;
        r.theta_layers.iter_mut().for_each(|t| *t = None);
    }
}

/// The encoding whose probe centroid is not a θ_eff (R59).
const TAPA: &str = "tapa";

/// The note under a table whose TAPA rows print no θ_eff.
pub const TAPA_THETA_NOTE: &str = "tapa: no θ_eff (–): its probe centroid is a phase frequency in radians per unit of |m − n|^α, not per token (docs/analysis-rules.md R59); runs.parquet keeps it in effective_freq\n";

/// Every pooling a set of runs offers, in print order: `positional` (R2), `window-layer` (R15,
/// when attention profiles were measured), `all`, then `layer:<l>`. One-layer models (or tables
/// without per-layer rows) have one spectrum per run: `all` only.
fn poolings(runs: &[&RunRecord]) -> Vec<String> {
    let n_layers = runs.iter().map(|r| r.theta_layers.len()).max().unwrap_or(0);
    if n_layers <= 1 {
        return vec!["all".to_string()];
    }
    let mut out = vec!["positional".to_string()];
    if runs.iter().any(|r| r.window_layer().is_some()) {
        out.push("window-layer".to_string());
    }
    out.push("all".to_string());
    out.extend((0..n_layers).map(|l| format!("layer:{l}")));
    out
}

fn theta_of(r: &RunRecord, pooling: &str) -> Option<f64> {
    match pooling {
        "all" => r.theta,
        "positional" => r.theta_positional,
        "window-layer" => r.theta_layers.get(r.window_layer()?).copied().flatten(),
        p => {
            let l: usize = p.strip_prefix("layer:")?.parse().ok()?;
            r.theta_layers.get(l).copied().flatten()
        }
    }
}

/// Fits per (rotary encoding, variant) × pooling × width source over the finished runs `done`,
/// in print order. NoPE is the control and TAPA's frequencies are per token pair (see
/// `probe`), so neither is fitted.
pub fn fits(sweep: &str, preset: &str, done: &[&RunRecord]) -> Vec<FitRow> {
    // Groups: encoding × variant × the encoding options a run sets (p-RoPE's rope_p, partial
    // rotary's rotary_dim, hybrid nope_every), and × rope_base × seq_len × pair_layout when the
    // sweep varies them (sweeps/base-vs-width.toml); the label names them, e.g.
    // `rope/copy base=100 L=512`, `p-rope/copy rope_p=0.25`.
    let settings: Vec<RunSetting> = done.iter().map(|r| r.setting.clone()).collect();
    let mut groups: BTreeMap<(String, String, String), Vec<&RunRecord>> = BTreeMap::new();
    for (r, setting) in done.iter().zip(setting_labels(&settings)) {
        let encoding: Option<Encoding> = serde_json::from_value(serde_json::json!(r.encoding)).ok();
        if encoding.is_some_and(Encoding::is_rotary) {
            groups
                .entry((r.encoding.clone(), r.variant.clone(), setting))
                .or_default()
                .push(r);
        }
    }
    let mut out = Vec::new();
    for width_source in ["dep_width", "mi"] {
        for ((enc, var, setting), runs) in &groups {
            for pooling in poolings(runs) {
                let pts: Vec<FitPoint> = runs
                    .iter()
                    .filter_map(|r| {
                        let width = match width_source {
                            "mi" => r.dep_width_mi? as f64,
                            _ => r.block_len as f64,
                        };
                        Some(FitPoint {
                            width,
                            theta: theta_of(r, &pooling)?,
                            seed: r.seed as u64,
                        })
                    })
                    .collect();
                let accuracies: Vec<Option<f64>> = runs
                    .iter()
                    .filter(|r| theta_of(r, &pooling).is_some())
                    .map(|r| r.acc)
                    .collect();
                if let Some(fit) = fit_law(&pts, 2000, 0) {
                    let support = support_of(&pts, &accuracies);
                    out.push(FitRow {
                        sweep: sweep.to_string(),
                        preset: preset.to_string(),
                        group: format!("{enc}/{var}{setting}"),
                        encoding: enc.clone(),
                        variant: var.clone(),
                        width_source: width_source.to_string(),
                        pooling: pooling.clone(),
                        fit,
                        support,
                    });
                }
            }
        }
    }
    out
}

/// What R57 reads of a fit's points (`width`, `seed`) and of its runs' final accuracies.
fn support_of(
    points: &[FitPoint],
    accuracies: &[Option<f64>],
) -> crate::results::tables::FitSupport {
    let mut seeds_at: BTreeMap<u64, std::collections::BTreeSet<u64>> = BTreeMap::new();
    for p in points {
        seeds_at
            .entry(p.width.to_bits())
            .or_default()
            .insert(p.seed);
    }
    let widths: Vec<f64> = seeds_at.keys().map(|b| f64::from_bits(*b)).collect();
    let (lo, hi) = widths.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &w| {
        (lo.min(w), hi.max(w))
    });
    let min_accuracy = accuracies
        .iter()
        .try_fold(f64::INFINITY, |m, a| a.map(|a| m.min(a)))
        .filter(|m| m.is_finite());
    crate::results::tables::FitSupport {
        n_widths: widths.len(),
        width_span: if lo > 0.0 { hi / lo } else { 0.0 },
        min_seeds_per_width: seeds_at.values().map(|s| s.len()).min().unwrap_or(0),
        min_accuracy,
    }
}

fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let m = xs.iter().sum::<f64>() / n;
    let sd = if xs.len() > 1 {
        (xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    (m, sd)
}

fn fmt_mean(xs: &[f64], digits: usize) -> String {
    if xs.is_empty() {
        return "–".to_string();
    }
    format!("{:.*}", digits, mean_sd(xs).0)
}

fn fit_line(f: &FitRow) -> String {
    let interval = if f.fit.n_seeds >= 2 {
        format!(
            "β = {:.3} [{:.3}, {:.3}]  c = {:.3} [{:.3}, {:.3}]",
            f.fit.fit.beta,
            f.fit.beta_ci.0,
            f.fit.beta_ci.1,
            f.fit.fit.c,
            f.fit.c_ci.0,
            f.fit.c_ci.1
        )
    } else {
        format!(
            "β = {:.3}  c = {:.3}  (one seed: no interval)",
            f.fit.fit.beta, f.fit.fit.c
        )
    };
    format!(
        "  {:<12} {:<11} {}  R² = {:.3}  (n = {}, {} seed{})\n",
        f.group,
        f.pooling,
        interval,
        f.fit.fit.r2,
        f.fit.n,
        f.fit.n_seeds,
        if f.fit.n_seeds == 1 { "" } else { "s" }
    )
}

/// The printed summary: a table per (variant, encoding, W) — accuracy, pooled θ_eff, π/W, entropy
/// — then θ_eff per layer with the positional layer and where runs stopped, the ablation table
/// when measured, and the fit lines (positional first; `W = B`, then `W` from MI).
pub fn summary_text(done: &[&RunRecord], fits: &[FitRow], failed: usize) -> String {
    let mut cells: BTreeMap<(String, String, i64), Vec<&RunRecord>> = BTreeMap::new();
    for r in done {
        cells
            .entry((r.variant.clone(), r.encoding.clone(), r.block_len))
            .or_default()
            .push(r);
    }
    let mut s = String::new();
    s.push_str(&format!(
        "{:<8} {:<6} {:>5} {:>5} {:>16} {:>18} {:>8} {:>16}\n",
        "task", "enc", "W", "runs", "acc (± sd)", "θ_eff (± sd)", "π/W", "entropy init→end"
    ));
    for ((var, enc, b), rs) in &cells {
        let accs: Vec<f64> = rs.iter().filter_map(|r| r.acc).collect();
        let th: Vec<f64> = rs.iter().filter_map(|r| r.theta).collect();
        let e0: Vec<f64> = rs.iter().filter_map(|r| r.entropy_init).collect();
        let e1: Vec<f64> = rs.iter().filter_map(|r| r.entropy).collect();
        let (am, asd) = mean_sd(&accs);
        let (tm, tsd) = mean_sd(&th);
        let theta = if th.is_empty() {
            format!("{:>18}", "–")
        } else {
            format!("{tm:>9.4} ± {tsd:<6.4}")
        };
        s.push_str(&format!(
            "{:<8} {:<6} {:>5} {:>5} {:>7.3} ± {:<6.3} {} {:>8.4} {:>7.2} → {:<6.2}\n",
            var,
            enc,
            b,
            rs.len(),
            am,
            asd,
            theta,
            std::f64::consts::PI / *b as f64,
            mean_sd(&e0).0,
            mean_sd(&e1).0
        ));
    }
    if done.iter().any(|r| r.encoding == TAPA) {
        s.push_str(TAPA_THETA_NOTE);
    }
    if failed > 0 {
        s.push_str(&format!(
            "{failed} run(s) failed: see runs.parquet (status, fail_reason)\n"
        ));
    }

    // Per layer: mean θ_eff of each layer at the final evaluation, the positional layer chosen
    // (docs/analysis-rules.md R2) per run, the MI width, and where training stopped.
    let n_layers = done.iter().map(|r| r.theta_layers.len()).max().unwrap_or(0);
    if n_layers > 0 {
        s.push_str("\nθ_eff per layer (final evaluation, mean over seeds), positional layer per run (KL from init), W from MI, where training stopped (mean; cap = never converged; fixed = a steps rule)\n");
        let mut head = format!("{:<8} {:<6} {:>5}", "task", "enc", "W");
        for l in 0..n_layers {
            head.push_str(&format!(" {:>9}", format!("layer {l}")));
        }
        head.push_str(&format!(
            " {:>9} {:>10} {:>6} {:>16}\n",
            "positional", "layer×runs", "W_MI", "converged at"
        ));
        s.push_str(&head);
        for ((var, enc, b), rs) in &cells {
            let mut line = format!("{var:<8} {enc:<6} {b:>5}");
            for l in 0..n_layers {
                let v: Vec<f64> = rs
                    .iter()
                    .filter_map(|r| r.theta_layers.get(l).copied().flatten())
                    .collect();
                line.push_str(&format!(" {:>9}", fmt_mean(&v, 4)));
            }
            let pos: Vec<f64> = rs.iter().filter_map(|r| r.theta_positional).collect();
            let mut counts: BTreeMap<i64, usize> = BTreeMap::new();
            for r in rs.iter() {
                if let Some(l) = r.positional_layer {
                    *counts.entry(l).or_default() += 1;
                }
            }
            let chosen = counts
                .iter()
                .map(|(l, n)| format!("L{l}×{n}"))
                .collect::<Vec<_>>()
                .join(",");
            let wmi: Vec<String> = {
                let mut v: Vec<i64> = rs.iter().filter_map(|r| r.dep_width_mi).collect();
                v.sort_unstable();
                v.dedup();
                v.iter().map(|w| w.to_string()).collect()
            };
            let conv: Vec<f64> = rs
                .iter()
                .filter_map(|r| r.converged_step.map(|c| c as f64))
                .collect();
            let capped = rs
                .iter()
                .filter(|r| r.spectrum_stop && r.converged_step.is_none())
                .count();
            let fixed: Vec<f64> = rs
                .iter()
                .filter(|r| !r.spectrum_stop)
                .filter_map(|r| r.steps_done.map(|s| s as f64))
                .collect();
            let stop = if !fixed.is_empty() {
                format!("fixed {}", fmt_mean(&fixed, 0))
            } else if conv.is_empty() && capped > 0 {
                format!("cap ×{capped}")
            } else if capped > 0 {
                format!("{:.0} (cap ×{capped})", mean_sd(&conv).0)
            } else {
                fmt_mean(&conv, 0)
            };
            line.push_str(&format!(
                " {:>9} {:>10} {:>6} {:>16}\n",
                fmt_mean(&pos, 4),
                if chosen.is_empty() {
                    "–".into()
                } else {
                    chosen
                },
                if wmi.is_empty() {
                    "–".into()
                } else {
                    wmi.join("/")
                },
                stop
            ));
            s.push_str(&line);
        }
    }

    // What each layer attends to: the most attended lag (its share), and the share within W.
    if done.iter().any(|r| r.attention.iter().any(|a| a.is_some())) {
        s.push_str("\nAttention per layer at the end: most attended lag Δ = t − s (its share; share at Δ < W), first seed; window layer per run (R15: largest share at Δ < W), all seeds\n");
        let mut head = format!("{:<8} {:<6} {:>5}", "task", "enc", "W");
        for l in 0..n_layers {
            head.push_str(&format!(" {:>22}", format!("layer {l}")));
        }
        head.push_str(&format!(" {:>12}", "window layer"));
        s.push_str(&head);
        s.push('\n');
        for ((var, enc, b), rs) in &cells {
            let Some(r) = rs.iter().min_by_key(|r| r.seed) else {
                continue;
            };
            let mut line = format!("{var:<8} {enc:<6} {b:>5}");
            for l in 0..n_layers {
                let cell = match r.attention.get(l).copied().flatten() {
                    Some((t, m, w)) => format!("Δ={t} ({m:.2}; {w:.2})"),
                    None => "–".to_string(),
                };
                line.push_str(&format!(" {cell:>22}"));
            }
            let mut counts: BTreeMap<usize, usize> = BTreeMap::new();
            for r in rs.iter() {
                if let Some(l) = r.window_layer() {
                    *counts.entry(l).or_default() += 1;
                }
            }
            let chosen: Vec<String> = counts.iter().map(|(l, n)| format!("L{l}×{n}")).collect();
            line.push_str(&format!(" {:>12}", chosen.join(",")));
            s.push_str(&line);
            s.push('\n');
        }
    }

    // The causal check: accuracy lost when the law band or the far band is set to θ = 0.
    let ablated: Vec<&&RunRecord> = done
        .iter()
        .filter(|r| r.ablation.drops().is_some())
        .collect();
    if !ablated.is_empty() {
        s.push_str(
            "\nAblation (θ = 0 on 2 rotary pairs; accuracy lost vs the unablated evaluation, mean over seeds)\n",
        );
        s.push_str(&format!(
            "{:<8} {:<6} {:>5} {:>9} {:>14} {:>14} {:>16}\n",
            "task", "enc", "W", "acc", "Δacc law band", "Δacc far band", "law ≥ 3× far"
        ));
        let mut holds_total = 0;
        for ((var, enc, b), rs) in &cells {
            let d: Vec<(f64, f64, f64)> = rs
                .iter()
                .filter_map(|r| {
                    let (l, f) = r.ablation.drops()?;
                    Some((r.ablation.base?.0, l, f))
                })
                .collect();
            if d.is_empty() {
                continue;
            }
            let holds = d
                .iter()
                .filter(|(_, l, f)| *l >= 3.0 * f.max(0.0) && *l > 0.0)
                .count();
            holds_total += holds;
            let col = |k: usize| -> Vec<f64> {
                d.iter()
                    .map(|t| match k {
                        0 => t.0,
                        1 => t.1,
                        _ => t.2,
                    })
                    .collect()
            };
            s.push_str(&format!(
                "{:<8} {:<6} {:>5} {:>9} {:>14} {:>14} {:>16}\n",
                var,
                enc,
                b,
                fmt_mean(&col(0), 3),
                fmt_mean(&col(1), 3),
                fmt_mean(&col(2), 3),
                format!("{holds}/{}", d.len())
            ));
        }
        s.push_str(&format!(
            "law band's loss ≥ 3× the far band's (and > 0) in {holds_total} of {} runs\n",
            ablated.len()
        ));
    }

    for (source, title) in [
        ("dep_width", "W = B"),
        ("mi", "W from the MI profile of each run's training data"),
    ] {
        let rows: Vec<&FitRow> = fits.iter().filter(|f| f.width_source == source).collect();
        if source == "mi" && rows.is_empty() {
            continue;
        }
        s.push_str(&format!(
            "\nLaw fit  ln θ_eff = ln c − β ln W  ({title}; reference θ* = π/W: β = 1, c = π ≈ 3.14; 95 % bootstrap over seeds)\n"
        ));
        if rows.is_empty() {
            s.push_str("  no fit: need finished rotary runs at ≥ 2 block lengths\n");
        }
        for f in &rows {
            s.push_str(&fit_line(f));
        }
        if source == "dep_width" {
            s.push_str(&verdict_lines(&rows));
        }
    }
    s
}

/// The verdict on the law for each group's headline fit (the positional layer's, else all
/// layers pooled: docs/analysis-rules.md R1–R2) against W = B, by
/// [`crate::results::tables::law_holds`]; empty without fits.
fn verdict_lines(rows: &[&FitRow]) -> String {
    let headline = if rows.iter().any(|f| f.pooling == "positional") {
        "positional"
    } else {
        "all"
    };
    let verdicts: Vec<String> = rows
        .iter()
        .filter(|f| f.pooling == headline)
        .map(|f| {
            format!(
                "{}: {} (β = {:.3}, R² = {:.3})",
                f.group,
                f.verdict(),
                f.fit.fit.beta,
                f.fit.fit.r2
            )
        })
        .collect();
    if verdicts.is_empty() {
        return String::new();
    }
    format!(
        "Verdict ({headline} pooling; the law holds when β ∈ [0.8, 1.2] and R² ≥ 0.8, given ≥ 4 widths over ≥ 4×, ≥ 3 seeds per width and accuracy ≥ 0.9 in every run: docs/analysis-rules.md R57): {}\n",
        verdicts.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(seed: i64, b: i64, theta_l0: f64, theta_l1: f64) -> RunRecord {
        RunRecord {
            id: format!("{seed}-{b}"),
            status: "done".into(),
            encoding: "rope".into(),
            variant: "copy".into(),
            block_len: b,
            setting: RunSetting {
                rope_base: 10000.0,
                seq_len: 128,
                pair_layout: "adjacent".into(),
                ..RunSetting::default()
            },
            seed,
            acc: Some(1.0),
            loss: None,
            theta: Some((theta_l0 * theta_l1).sqrt()),
            theta_positional: Some(theta_l0),
            positional_layer: Some(0),
            theta_layers: vec![Some(theta_l0), Some(theta_l1)],
            attention: vec![Some((b - 1, 0.9, 1.0)), None],
            dep_width_mi: Some(b - 1),
            steps_done: Some(500),
            converged_step: Some(500),
            spectrum_stop: true,
            entropy_init: Some(2.7),
            entropy: Some(1.0),
            ablation: Ablations {
                base: Some((0.9, 0.1)),
                law: Some((0.3, 2.0)),
                far: Some((0.85, 0.2)),
            },
        }
    }

    /// A sweep that varies rope_base or seq_len (base-vs-width) is fitted per setting, and the
    /// group names it; a sweep that varies neither keeps the `encoding/variant` label.
    #[test]
    fn fits_are_grouped_by_base_and_length_when_the_sweep_varies_them() {
        let mut runs: Vec<RunRecord> = Vec::new();
        for (base, c) in [(100.0, 1.0), (1e6, 3.0)] {
            for b in [4, 16, 64] {
                let mut r = rec(0, b, c / b as f64, 0.01);
                r.setting.rope_base = base;
                runs.push(r);
            }
        }
        let done: Vec<&RunRecord> = runs.iter().collect();
        let f = fits("base-vs-width", "quick", &done);
        let pos: Vec<&FitRow> = f
            .iter()
            .filter(|r| r.pooling == "positional" && r.width_source == "dep_width")
            .collect();
        let groups: Vec<&str> = pos.iter().map(|r| r.group.as_str()).collect();
        assert_eq!(groups, ["rope/copy base=100", "rope/copy base=1000000"]);
        assert!((pos[0].fit.fit.c - 1.0).abs() < 1e-9 && (pos[1].fit.fit.c - 3.0).abs() < 1e-9);
        assert!(pos.iter().all(|r| (r.fit.fit.beta - 1.0).abs() < 1e-9));
        let one: Vec<&RunRecord> = runs[..3].iter().collect();
        assert!(fits("x", "q", &one).iter().all(|r| r.group == "rope/copy"));
        // Encoding options split groups whatever else varies.
        let mut hybrid = runs[..3].to_vec();
        hybrid
            .iter_mut()
            .for_each(|r| r.setting.nope_every = Some(2));
        let both: Vec<&RunRecord> = runs[..3].iter().chain(&hybrid).collect();
        let groups: std::collections::BTreeSet<String> =
            fits("x", "q", &both).into_iter().map(|r| r.group).collect();
        assert_eq!(
            groups.into_iter().collect::<Vec<_>>(),
            ["rope/copy", "rope/copy nope_every=2"]
        );
    }

    /// Layer 0 follows π/W exactly and layer 1 is flat: the positional and layer:0 fits give
    /// β = 1, c = π; layer:1 gives β = 0; `all` (geometric mean of the two) β = ½.
    #[test]
    fn fits_per_pooling_and_width_source() {
        let pi = std::f64::consts::PI;
        let runs: Vec<RunRecord> = (0..2)
            .flat_map(|seed| [4, 16, 64].map(|b| rec(seed, b, pi / b as f64, 0.01)))
            .collect();
        let done: Vec<&RunRecord> = runs.iter().collect();
        let f = fits("t", "p", &done);
        let get = |pool: &str, src: &str| {
            f.iter()
                .find(|r| r.pooling == pool && r.width_source == src)
                .unwrap()
                .fit
                .fit
        };
        assert_eq!(f[0].pooling, "positional");
        for pool in ["positional", "layer:0"] {
            assert!((get(pool, "dep_width").beta - 1.0).abs() < 1e-12);
            assert!((get(pool, "dep_width").c - pi).abs() < 1e-9);
        }
        assert!(get("layer:1", "dep_width").beta.abs() < 1e-12);
        assert!((get("all", "dep_width").beta - 0.5).abs() < 1e-12);
        // Against W_MI = B − 1 the slope differs from 1.
        assert!((get("positional", "mi").beta - 1.0).abs() > 1e-3);
        let text = summary_text(&done, &f, 0);
        assert!(
            text.contains("law band's loss ≥ 3× the far band's (and > 0) in 6 of 6 runs"),
            "{text}"
        );
        assert!(text.contains("L0×2"), "{text}");
        assert!(text.contains("Δ=63 (0.90; 1.00)"), "{text}");
        let pos = text.find("rope/copy    positional").unwrap();
        let all = text.find("rope/copy    all").unwrap();
        assert!(pos < all, "positional is printed first");
        // The verdict (R57): 2 seeds at 3 widths are below its minimum, whatever the fit.
        assert!(
            text.contains("Verdict (positional pooling; the law holds when β ∈ [0.8, 1.2] and R² ≥ 0.8, given ≥ 4 widths over ≥ 4×, ≥ 3 seeds per width and accuracy ≥ 0.9 in every run: docs/analysis-rules.md R57): rope/copy: no verdict: 3 width(s) over 16× (needs ≥ 4 over ≥ 4×); 2 seed(s) at some width (needs ≥ 3 at every width) (β = 1.000, R² = 1.000)"),
            "{text}"
        );
    }

    /// R57 (docs/analysis-rules.md): a verdict needs ≥ 4 widths over ≥ 4×, ≥ 3 seeds at every
    /// width and every run at accuracy ≥ 0.9; then β ∈ [0.8, 1.2] and R² ≥ 0.8 decide. Before
    /// it, the smoke preset (2 widths, 1 seed, accuracy 0.07–0.36) printed "the law holds".
    #[test]
    fn a_verdict_needs_widths_seeds_and_learned_runs() {
        let pi = std::f64::consts::PI;
        let verdict = |runs: &[RunRecord]| -> String {
            let done: Vec<&RunRecord> = runs.iter().collect();
            let f = fits("t", "p", &done);
            f.iter()
                .find(|r| r.pooling == "positional" && r.width_source == "dep_width")
                .unwrap()
                .verdict()
        };
        let grid = |theta: &dyn Fn(i64) -> f64, seeds: i64, widths: &[i64]| -> Vec<RunRecord> {
            (0..seeds)
                .flat_map(|seed| widths.iter().map(move |&b| (seed, b)))
                .map(|(seed, b)| rec(seed, b, theta(b), 0.01))
                .collect()
        };
        let law = |b: i64| pi / b as f64;
        let full = grid(&law, 3, &[4, 8, 16, 64]);
        assert_eq!(verdict(&full), "the law holds");
        let flat = |b: i64| 0.01 * (1.0 + b as f64 * 1e-3);
        assert_eq!(verdict(&grid(&flat, 3, &[4, 8, 16, 64])), "not reproduced");
        // One run that did not learn: no verdict, whatever the slope.
        let mut weak = full.clone();
        weak[5].acc = Some(0.36);
        assert_eq!(
            verdict(&weak),
            "no verdict: a run at accuracy 0.360 (needs ≥ 0.9 in every run)"
        );
        weak[5].acc = None;
        assert_eq!(verdict(&weak), "no verdict: a run without a final accuracy");
        // Widths: 3, or 4 over less than 4×.
        assert_eq!(
            verdict(&grid(&law, 3, &[4, 16, 64])),
            "no verdict: 3 width(s) over 16× (needs ≥ 4 over ≥ 4×)"
        );
        assert_eq!(
            verdict(&grid(&law, 3, &[8, 9, 10, 12])),
            "no verdict: 4 width(s) over 1.5× (needs ≥ 4 over ≥ 4×)"
        );
        // Seeds: one width with 2 seeds.
        let mut thin = full.clone();
        thin.retain(|r| !(r.seed == 2 && r.block_len == 8));
        assert_eq!(
            verdict(&thin),
            "no verdict: 2 seed(s) at some width (needs ≥ 3 at every width)"
        );
        // The smoke preset's case: 2 widths, 1 seed, accuracy 0.07–0.36: every reason, in order.
        let mut smoke = grid(&law, 1, &[4, 16]);
        smoke[0].acc = Some(0.07);
        smoke[1].acc = Some(0.36);
        assert_eq!(
            verdict(&smoke),
            "no verdict: 2 width(s) over 4× (needs ≥ 4 over ≥ 4×); 1 seed(s) at some width (needs ≥ 3 at every width); a run at accuracy 0.070 (needs ≥ 0.9 in every run)"
        );
    }

    /// R15: the window layer is the layer with the largest share inside the window (ties to the
    /// lower layer, NoPE layers of hybrids excluded), and its pooling fits that layer's θ_eff.
    #[test]
    fn window_layer_rule_and_its_pooling() {
        let pi = std::f64::consts::PI;
        let mut r = rec(0, 8, 0.5, pi / 8.0);
        assert_eq!(r.window_layer(), Some(0), "layer 1 has no profile");
        r.attention = vec![Some((0, 0.5, 0.30)), Some((3, 0.4, 0.80))];
        assert_eq!(r.window_layer(), Some(1));
        r.attention[0] = Some((0, 0.5, 0.80));
        assert_eq!(r.window_layer(), Some(0), "a tie goes to the lower layer");
        r.attention[0] = Some((0, 0.5, 0.10));
        r.setting.nope_every = Some(2);
        assert_eq!(
            r.window_layer(),
            Some(0),
            "layer 1 is NoPE in a nope_every = 2 model"
        );
        r.attention = vec![None, None];
        assert_eq!(r.window_layer(), None);
        // Positional layer 0 is flat; the window layer (1) follows π/W exactly.
        let runs: Vec<RunRecord> = (0..2)
            .flat_map(|seed| {
                [4, 16, 64].map(|b| {
                    let mut r = rec(seed, b, 0.5, pi / b as f64);
                    r.attention = vec![Some((0, 0.9, 0.2)), Some((b - 1, 0.9, 0.9))];
                    r
                })
            })
            .collect();
        let done: Vec<&RunRecord> = runs.iter().collect();
        let f = fits("t", "p", &done);
        let order: Vec<&str> = f.iter().take(3).map(|r| r.pooling.as_str()).collect();
        assert_eq!(order, ["positional", "window-layer", "all"]);
        let w = f.iter().find(|r| r.pooling == "window-layer").unwrap();
        assert!((w.fit.fit.beta - 1.0).abs() < 1e-12 && (w.fit.fit.c - pi).abs() < 1e-9);
        assert!(summary_text(&done, &f, 0).contains("L1×2"));
    }

    /// The ablation baseline comes from the entry that ablated; an `adhoc` evaluation of the
    /// same run (here with other numbers) is ignored, and so are other lengths.
    #[test]
    fn read_records_pairs_ablations_with_their_own_baseline() {
        use crate::results::{TableBuilder, write_batch};
        let dir = std::env::temp_dir().join(format!("lab-law-read-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let runs = TableBuilder::new(1)
            .str("run_id", vec!["r".into()])
            .str("status", vec!["done".into()])
            .str("encoding", vec!["rope".into()])
            .str("variant", vec!["copy".into()])
            .str("task", vec!["block".into()])
            .i64("dep_width", vec![8])
            .i64("seed", vec![0])
            .build();
        write_batch(&dir.join("runs.parquet"), &runs).unwrap();
        let rows = [
            ("adhoc", "", 1.0, 0.1),
            ("ablation", "", 1.0, 0.9),
            ("ablation", "law", 1.0, 0.2),
            ("ablation", "far", 1.0, 0.8),
            ("ablation", "law", 2.0, 0.0),
        ];
        let n = rows.len();
        let evals = TableBuilder::new(n)
            .str("run_id", vec!["r".into(); n])
            .str("eval_name", rows.iter().map(|r| r.0.to_string()).collect())
            .str(
                "ablate_band",
                rows.iter().map(|r| r.1.to_string()).collect(),
            )
            .f64("length_ratio", rows.iter().map(|r| r.2).collect())
            .str("scaling", vec!["none".into(); n])
            .f64("accuracy", rows.iter().map(|r| r.3).collect())
            .f64("loss", vec![1.0; n])
            .build();
        write_batch(&dir.join("evals.parquet"), &evals).unwrap();
        let recs = read_records(&dir, &["r".to_string()]).unwrap();
        assert_eq!(
            recs[0].ablation,
            Ablations {
                base: Some((0.9, 1.0)),
                law: Some((0.2, 1.0)),
                far: Some((0.8, 1.0)),
            }
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn ablation_drops_need_all_three_evaluations() {
        let mut a = Ablations {
            base: Some((0.9, 0.1)),
            law: Some((0.4, 1.0)),
            far: Some((0.8, 0.3)),
        };
        let (l, f) = a.drops().unwrap();
        assert!((l - 0.5).abs() < 1e-12 && (f - 0.1).abs() < 1e-12);
        a.far = None;
        assert_eq!(a.drops(), None);
    }

    /// TAPA's records lose their θ_eff (R59) and the summary prints `–` with the note; a RoPE
    /// record beside it keeps its value.
    #[test]
    fn tapa_prints_no_theta() {
        let mut recs = vec![rec(0, 8, 0.2, 0.1), rec(0, 8, 0.3, 0.4)];
        recs[1].encoding = "tapa".into();
        recs[1].id = "tapa".into();
        drop_tapa_theta(&mut recs);
        assert_eq!(recs[0].theta_positional, Some(0.2));
        assert_eq!(recs[1].theta, None);
        assert_eq!(recs[1].theta_positional, None);
        assert_eq!(recs[1].theta_layers, vec![None, None]);
        let done: Vec<&RunRecord> = recs.iter().collect();
        let text = summary_text(&done, &[], 0);
        let tapa_row = text
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some("tapa"))
            .expect("a tapa row");
        assert!(tapa_row.contains('–'), "{tapa_row}");
        let rope_row = text
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some("rope"))
            .expect("a rope row");
        assert!(rope_row.contains("0.1414"), "{rope_row}");
        assert!(text.contains(TAPA_THETA_NOTE), "{text}");
    }
}

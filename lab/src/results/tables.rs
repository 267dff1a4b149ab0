//! The lab's tables for one run: `runs` (one row), `curves`, `spectrum` (schemas in
//! `results/README.md`), and the sweep-level `fit` table.

use arrow_array::RecordBatch;

use super::TableBuilder;
use crate::analysis::LawFit;
use crate::config::RunConfig;
use crate::probe;
use crate::train::{RunStatus, TrainOutcome};

/// Where a run belongs.
#[derive(Clone, Debug)]
pub struct RunMeta {
    /// Sweep name.
    pub sweep: String,
    /// Preset name.
    pub preset: String,
    /// Backend name (`cpu`).
    pub backend: String,
}

/// The config as columns: every field of [`RunConfig`] and every parameter of the run's own task
/// ([`RunConfig::flat`]) becomes a column of its JSON type (strings → utf8, integers → int64,
/// floats → float64), plus `dep_width`. A parameter of another task is no column of this run
/// (null once runs of several tasks are merged into one table).
fn config_columns(mut t: TableBuilder, cfg: &RunConfig) -> TableBuilder {
    let obj = cfg.flat();
    for (k, v) in &obj {
        t = match v {
            serde_json::Value::String(s) => t.str(k, vec![s.clone()]),
            serde_json::Value::Number(n) if n.is_f64() => t.f64(k, vec![n.as_f64().unwrap()]),
            serde_json::Value::Number(n) => t.i64(k, vec![n.as_i64().unwrap_or(i64::MAX)]),
            serde_json::Value::Bool(b) => t.bool(k, vec![*b]),
            other => t.str(k, vec![other.to_string()]),
        };
    }
    t.i64("dep_width", vec![cfg.dep_width() as i64])
}

/// The one-row `runs` table of a finished (or failed) run.
pub fn runs_row(cfg: &RunConfig, meta: &RunMeta, out: &TrainOutcome) -> RecordBatch {
    let (status, fail_step, fail_reason) = match &out.status {
        RunStatus::Done => ("done".to_string(), None, None),
        RunStatus::Failed { step, reason } => (
            "failed".to_string(),
            Some(*step as i64),
            Some(reason.clone()),
        ),
    };
    let last_train = out.curves.iter().rev().find(|p| p.split == "train");
    let init = out.initial.as_ref();
    let last = out.last.as_ref();
    let pos = positional(cfg, out);
    let t = TableBuilder::new(1)
        .str("run_id", vec![cfg.run_id()])
        .str("sweep", vec![meta.sweep.clone()])
        .str("preset", vec![meta.preset.clone()])
        .str("status", vec![status])
        .opt_i64("fail_step", vec![fail_step])
        .opt_str("fail_reason", vec![fail_reason]);
    let t = config_columns(t, cfg)
        .opt_f64("final_train_loss", vec![last_train.map(|p| p.loss)])
        .opt_f64("final_eval_loss", vec![last.map(|e| e.loss)])
        .opt_f64("final_eval_accuracy", vec![last.map(|e| e.accuracy)])
        .opt_f64("val_loss", vec![out.val.map(|v| v.0)])
        .opt_f64("val_accuracy", vec![out.val.map(|v| v.1)])
        .opt_f64("answer_accuracy", vec![out.answer_accuracy])
        .opt_f64("solution_valid", vec![out.solution_valid]);
    // iGSM's teacher-forced accuracy by part of the solution: `acc_tf_<role>`.
    let t = crate::decode::SolutionRole::ALL
        .iter()
        .enumerate()
        .fold(t, |t, (i, role)| {
            t.opt_f64(
                &format!("acc_tf_{}", role.name()),
                vec![out.solution_role_accuracy.map(|a| a[i])],
            )
        });
    t.opt_f64(
        "answer_accuracy_train_structures",
        vec![out.answer_accuracy_train_structures],
    )
    .opt_f64(
        "acc_tf_definition_train_structures",
        vec![out.acc_tf_definition_train_structures],
    )
    .opt_f64("acc_shift0", vec![out.acc_shift0])
    .opt_f64("acc_shift_nonzero", vec![out.acc_shift_nonzero])
    .opt_f64("init_eval_loss", vec![init.map(|e| e.loss)])
    .opt_f64(
        "effective_freq",
        vec![last.map(|e| e.summary.effective_freq)],
    )
    .opt_f64(
        "effective_freq_init",
        vec![init.map(|e| e.summary.effective_freq)],
    )
    .opt_f64(
        "effective_freq_batch_sd",
        vec![last.map(|e| e.effective_freq_batch_sd)],
    )
    .opt_f64("spectrum_entropy", vec![last.map(|e| e.summary.entropy)])
    .opt_f64(
        "spectrum_entropy_init",
        vec![init.map(|e| e.summary.entropy)],
    )
    .opt_f64("argmax_freq", vec![last.map(|e| e.summary.argmax_freq)])
    .opt_i64("steps_done", vec![last_train.map(|p| p.step as i64)])
    .opt_i64("converged_step", vec![out.converged_step.map(|s| s as i64)])
    .opt_i64(
        "positional_layer",
        vec![pos.as_ref().map(|p| p.layer as i64)],
    )
    .opt_f64(
        "effective_freq_positional",
        vec![pos.as_ref().map(|p| p.effective_freq)],
    )
    .opt_f64("positional_kl", vec![pos.as_ref().map(|p| p.kl)])
    .opt_i64("dep_width_mi", vec![out.dep_width_mi.map(|w| w as i64)])
    .f64(
        "reference_freq",
        vec![std::f64::consts::PI / cfg.dep_width() as f64],
    )
    .f64("wall_time_s", vec![out.wall_time_s])
    .f64("ms_per_step", vec![out.ms_per_step])
    .f64("tokens_per_s", vec![out.tokens_per_s])
    .f64("probe_ms", vec![out.probe_ms])
    .str("backend", vec![meta.backend.clone()])
    .str("lab_version", vec![env!("CARGO_PKG_VERSION").to_string()])
    .str("config_json", vec![cfg.canonical_json()])
    .build()
}

/// A run's positional layer (docs/analysis-rules.md, R2) and its spectrum's θ_eff.
#[derive(Clone, Debug, PartialEq)]
pub struct Positional {
    /// The layer `l*` whose spectrum moved furthest (KL) from its initialisation.
    pub layer: usize,
    /// θ_eff of that layer's spectrum at the last evaluation, radians per token.
    pub effective_freq: f64,
    /// `KL(p̄_{l*}^final ‖ p̄_{l*}^init)`, nats.
    pub kl: f64,
}

/// The positional layer of a finished run, from its first and last evaluations (`None` without
/// both).
pub fn positional(cfg: &RunConfig, out: &TrainOutcome) -> Option<Positional> {
    let (init, last) = (out.initial.as_ref()?, out.last.as_ref()?);
    let p_init = probe::layer_spectra(&init.energy);
    let p_last = probe::layer_spectra(&last.energy);
    // Hybrid models: only the layers that use the run's encoding are candidates
    // (docs/analysis-rules.md R2); a NoPE layer's spectrum is a control.
    let model = cfg.model();
    let candidates: Vec<bool> = (0..p_last.len())
        .map(|l| model.layer_encoding(l) == cfg.encoding.kind())
        .collect();
    let (layer, kls) = probe::positional_layer_among(&p_init, &p_last, &candidates)?;
    Some(Positional {
        layer,
        effective_freq: probe::effective_freq(&p_last[layer], &cfg.freq_grid()),
        kl: kls[layer],
    })
}

/// The `layers` table of a run: one row per evaluation and layer, with the layer's spectrum
/// summarised (θ_eff, entropy, argmax frequency of `p̄_l`, docs/analysis-rules.md R1), its KL
/// from the layer's step-0 spectrum, and whether the row is the run's final evaluation
/// (`is_final`) and its positional layer (`is_positional`, set on every row of that layer).
/// Final rows also say what the layer attends to ([`TrainOutcome::attention_lags`]): the lag
/// with the most attention (`attn_top_lag`, tokens), its share, and the share at lags below the
/// dependency width `W` (`attn_mass_in_window`).
pub fn layers_table(cfg: &RunConfig, out: &TrainOutcome) -> RecordBatch {
    let theta = cfg.freq_grid();
    let pos = positional(cfg, out).map(|p| p.layer);
    let final_step = out
        .curves
        .iter()
        .filter(|p| p.split == "eval")
        .map(|p| p.step)
        .max();
    // Spectra grouped by evaluation step, in order: energy[layer][head][i].
    let mut by_step: std::collections::BTreeMap<usize, Vec<Vec<Vec<f64>>>> = Default::default();
    for s in &out.spectra {
        let layers = by_step.entry(s.step).or_default();
        if layers.len() <= s.layer {
            layers.resize(s.layer + 1, Vec::new());
        }
        layers[s.layer].push(s.energy.clone());
    }
    let init = by_step.values().next().map(|e| probe::layer_spectra(e));
    let (mut step, mut layer, mut th, mut ent, mut arg, mut kl, mut fin, mut is_pos) = (
        vec![],
        vec![],
        vec![],
        vec![],
        vec![],
        vec![],
        vec![],
        vec![],
    );
    let (mut top, mut top_mass, mut in_window) = (vec![], vec![], vec![]);
    let width = cfg.dep_width();
    for (&s, energy) in &by_step {
        for (l, p) in probe::layer_spectra(energy).iter().enumerate() {
            let sum = probe::summarise(p, &theta);
            step.push(s as i64);
            layer.push(l as i64);
            th.push(sum.effective_freq);
            ent.push(sum.entropy);
            arg.push(sum.argmax_freq);
            kl.push(
                init.as_ref()
                    .and_then(|i| i.get(l))
                    .map(|q| probe::kl_divergence(p, q))
                    .unwrap_or(f64::NAN),
            );
            let is_final = Some(s) == final_step;
            fin.push(is_final);
            is_pos.push(Some(l) == pos);
            let lags = out
                .attention_lags
                .as_ref()
                .and_then(|a| a.get(l))
                .filter(|_| is_final);
            let t = lags.map(|p| probe::top_lag(p));
            top.push(t.map(|t| t.0 as i64));
            top_mass.push(t.map(|t| t.1));
            in_window.push(lags.map(|p| p.iter().take(width).sum::<f64>()));
        }
    }
    let n = step.len();
    TableBuilder::new(n)
        .str("run_id", vec![cfg.run_id(); n])
        .str("encoding", vec![cfg.encoding.name().to_string(); n])
        .i64("step", step)
        .i64("layer", layer)
        .f64("effective_freq", th)
        .f64("spectrum_entropy", ent)
        .f64("argmax_freq", arg)
        .f64("kl_from_init", kl)
        .bool("is_final", fin)
        .bool("is_positional", is_pos)
        .opt_i64("attn_top_lag", top)
        .opt_f64("attn_top_lag_mass", top_mass)
        .opt_f64("attn_mass_in_window", in_window)
        .build()
}

/// The `attention` table of an indirect-indexing run: one row per layer × head × [`Role`], the final
/// prompt token's mean attention on that role over `n_examples` held-out examples with shift ≠ 0
/// ([`crate::indirect::final_token_attention`]).
///
/// [`Role`]: crate::indirect::Role
pub fn attention_table(
    cfg: &RunConfig,
    n_examples: usize,
    shares: &[Vec<[f64; 5]>],
) -> RecordBatch {
    let (mut layer, mut head, mut role, mut share) = (vec![], vec![], vec![], vec![]);
    for (l, heads) in shares.iter().enumerate() {
        for (h, by_role) in heads.iter().enumerate() {
            for r in crate::indirect::Role::ALL {
                layer.push(l as i64);
                head.push(h as i64);
                role.push(r.name().to_string());
                share.push(by_role[r as usize]);
            }
        }
    }
    let rows = layer.len();
    TableBuilder::new(rows)
        .str("run_id", vec![cfg.run_id(); rows])
        .i64("layer", layer)
        .i64("head", head)
        .str("role", role)
        .f64("share", share)
        .i64("n_examples", vec![n_examples as i64; rows])
        .build()
}

/// The `curves` table of a run.
pub fn curves_table(cfg: &RunConfig, out: &TrainOutcome) -> RecordBatch {
    let c = &out.curves;
    TableBuilder::new(c.len())
        .str("run_id", vec![cfg.run_id(); c.len()])
        .i64("step", c.iter().map(|p| p.step as i64).collect())
        .str("split", c.iter().map(|p| p.split.to_string()).collect())
        .f64("loss", c.iter().map(|p| p.loss).collect())
        .f64("accuracy", c.iter().map(|p| p.accuracy).collect())
        .f64("lr", c.iter().map(|p| p.lr).collect())
        .opt_f64("grad_norm", c.iter().map(|p| p.grad_norm).collect())
        .opt_f64(
            "effective_freq",
            c.iter().map(|p| p.effective_freq).collect(),
        )
        .opt_f64(
            "effective_freq_batch_sd",
            c.iter().map(|p| p.effective_freq_batch_sd).collect(),
        )
        .opt_f64(
            "spectrum_entropy",
            c.iter().map(|p| p.spectrum_entropy).collect(),
        )
        .opt_f64("argmax_freq", c.iter().map(|p| p.argmax_freq).collect())
        .opt_f64(
            "answer_accuracy",
            c.iter().map(|p| p.answer_accuracy).collect(),
        )
        .opt_i64(
            "answer_ops",
            c.iter().map(|p| p.answer_ops.map(|o| o as i64)).collect(),
        )
        .build()
}

/// The `spectrum` table of a run: one row per evaluation step, layer, head and rotary pair.
pub fn spectrum_table(cfg: &RunConfig, out: &TrainOutcome) -> RecordBatch {
    let theta = cfg.freq_grid();
    let (mut step, mut layer, mut head, mut idx, mut th, mut energy, mut frac) =
        (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
    for s in &out.spectra {
        let p = probe::normalise(&s.energy);
        for (i, (&e, &pi)) in s.energy.iter().zip(&p).enumerate() {
            step.push(s.step as i64);
            layer.push(s.layer as i64);
            head.push(s.head as i64);
            idx.push(i as i64);
            th.push(theta[i]);
            energy.push(e);
            frac.push(pi);
        }
    }
    let n = step.len();
    TableBuilder::new(n)
        .str("run_id", vec![cfg.run_id(); n])
        .str("encoding", vec![cfg.encoding.name().to_string(); n])
        .i64("step", step)
        .i64("layer", layer)
        .i64("head", head)
        .i64("freq_index", idx)
        .f64("theta", th)
        .f64("energy", energy)
        .f64("energy_frac", frac)
        .build()
}

/// One row of the `fit` table.
#[derive(Clone, Debug)]
pub struct FitRow {
    /// Sweep name.
    pub sweep: String,
    /// Preset name.
    pub preset: String,
    /// Group label, `encoding/variant`.
    pub group: String,
    /// Encoding.
    pub encoding: String,
    /// Task variant.
    pub variant: String,
    /// Which width the fit uses: `dep_width` (W = B for the block task) or `mi` (W from the
    /// MI profile of the run's training data, docs/analysis-rules.md R4).
    pub width_source: String,
    /// Which spectrum of each run: `all`, `layer:<l>` or `positional` (docs/analysis-rules.md R1).
    pub pooling: String,
    /// The fit.
    pub fit: LawFit,
    /// What the fit's runs are made of, for the verdict's minimum (docs/analysis-rules.md R57).
    pub support: FitSupport,
}

/// The runs behind one fit, as R57 (docs/analysis-rules.md) reads them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FitSupport {
    /// Distinct widths `W`.
    pub n_widths: usize,
    /// Largest width over the smallest.
    pub width_span: f64,
    /// Fewest seeds at any one width.
    pub min_seeds_per_width: usize,
    /// Lowest final held-out accuracy among the runs (`None` when a run has no accuracy).
    pub min_accuracy: Option<f64>,
}

/// R57's minimum for a verdict: distinct widths.
pub const VERDICT_MIN_WIDTHS: usize = 4;
/// R57's minimum for a verdict: the largest width over the smallest.
pub const VERDICT_MIN_SPAN: f64 = 4.0;
/// R57's minimum for a verdict: seeds at every width.
pub const VERDICT_MIN_SEEDS: usize = 3;
/// R57's minimum for a verdict: every run's final held-out accuracy.
pub const VERDICT_MIN_ACCURACY: f64 = 0.9;

/// Whether a law fit reproduces θ* ∝ 1/W: β ∈ [0.8, 1.2] and R² ≥ 0.8 (issue 14's criterion for
/// the block-width law, stated before the fits; `lab sweep`'s verdict lines and `lab report`'s
/// verdict column apply it to the headline pooling of docs/analysis-rules.md R1–R2, through
/// [`law_verdict`]).
pub fn law_holds(beta: f64, r2: f64) -> bool {
    (0.8..=1.2).contains(&beta) && r2 >= 0.8
}

/// The verdict on a law fit (docs/analysis-rules.md R57, then [`law_holds`]): `the law holds`,
/// `not reproduced`, or `no verdict: <reasons>` when its runs miss a minimum — fewer than
/// [`VERDICT_MIN_WIDTHS`] widths or a span under [`VERDICT_MIN_SPAN`]×, fewer than
/// [`VERDICT_MIN_SEEDS`] seeds at some width, a run below [`VERDICT_MIN_ACCURACY`] (or without
/// an accuracy).
pub fn law_verdict(beta: f64, r2: f64, support: &FitSupport) -> String {
    let mut missing = Vec::new();
    if support.n_widths < VERDICT_MIN_WIDTHS || support.width_span < VERDICT_MIN_SPAN {
        missing.push(format!(
            "{} width(s) over {}× (needs ≥ {VERDICT_MIN_WIDTHS} over ≥ {VERDICT_MIN_SPAN}×)",
            support.n_widths,
            (support.width_span * 10.0).round() / 10.0
        ));
    }
    if support.min_seeds_per_width < VERDICT_MIN_SEEDS {
        missing.push(format!(
            "{} seed(s) at some width (needs ≥ {VERDICT_MIN_SEEDS} at every width)",
            support.min_seeds_per_width
        ));
    }
    match support.min_accuracy {
        Some(a) if a >= VERDICT_MIN_ACCURACY => {}
        Some(a) => missing.push(format!(
            "a run at accuracy {a:.3} (needs ≥ {VERDICT_MIN_ACCURACY} in every run)"
        )),
        None => missing.push("a run without a final accuracy".to_string()),
    }
    if !missing.is_empty() {
        return format!("no verdict: {}", missing.join("; "));
    }
    if law_holds(beta, r2) {
        "the law holds".to_string()
    } else {
        "not reproduced".to_string()
    }
}

impl FitRow {
    /// [`law_verdict`] of this fit.
    pub fn verdict(&self) -> String {
        law_verdict(self.fit.fit.beta, self.fit.fit.r2, &self.support)
    }
}

/// The `fit` table.
pub fn fit_table(rows: &[FitRow]) -> RecordBatch {
    let n = rows.len();
    let s = |f: &dyn Fn(&FitRow) -> String| rows.iter().map(f).collect::<Vec<_>>();
    let x = |f: &dyn Fn(&FitRow) -> f64| rows.iter().map(f).collect::<Vec<_>>();
    TableBuilder::new(n)
        .str("sweep", s(&|r| r.sweep.clone()))
        .str("preset", s(&|r| r.preset.clone()))
        .str("group", s(&|r| r.group.clone()))
        .str("encoding", s(&|r| r.encoding.clone()))
        .str("variant", s(&|r| r.variant.clone()))
        .str("width_source", s(&|r| r.width_source.clone()))
        .str("pooling", s(&|r| r.pooling.clone()))
        .f64("beta", x(&|r| r.fit.fit.beta))
        .f64("c", x(&|r| r.fit.fit.c))
        .f64("r2", x(&|r| r.fit.fit.r2))
        .f64("beta_ci_low", x(&|r| r.fit.beta_ci.0))
        .f64("beta_ci_high", x(&|r| r.fit.beta_ci.1))
        .f64("c_ci_low", x(&|r| r.fit.c_ci.0))
        .f64("c_ci_high", x(&|r| r.fit.c_ci.1))
        .i64("n", rows.iter().map(|r| r.fit.n as i64).collect())
        .i64(
            "n_seeds",
            rows.iter().map(|r| r.fit.n_seeds as i64).collect(),
        )
        .i64("n_boot", rows.iter().map(|r| r.fit.n_boot as i64).collect())
        .str("resample", s(&|r| r.fit.resample.to_string()))
        .f64("reference_c", vec![std::f64::consts::PI; n])
        .i64(
            "n_widths",
            rows.iter().map(|r| r.support.n_widths as i64).collect(),
        )
        .f64("width_span", x(&|r| r.support.width_span))
        .i64(
            "min_seeds_per_width",
            rows.iter()
                .map(|r| r.support.min_seeds_per_width as i64)
                .collect(),
        )
        .f64(
            "min_accuracy",
            x(&|r| r.support.min_accuracy.unwrap_or(f64::NAN)),
        )
        .str("verdict", s(&|r| r.verdict()))
        .build()
}

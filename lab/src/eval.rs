//! Evaluating a checkpoint at another context length, with any RoPE scaling (`lab eval`).
//!
//! The run's task is regenerated at the requested `seq_len` (optionally with other task
//! parameters, e.g. a dilated `block_len`), from the held-out stream of the run's seed. For RoPE
//! the frequencies are replaced by the requested scaling (original length = the training
//! `seq_len`); PoPE, TAPA and NoPE are evaluated as trained. Results are one-row `evals` tables
//! (schema in `results/README.md`) in `<checkpoint>/evals/<eval_id>.parquet`, merged into
//! `<sweep folder>/evals.parquet` when the checkpoint lies in a sweep's `runs/` folder.

use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;
use burn::tensor::Device;

use crate::checkpoint::{self, CheckpointError};
use crate::config::{ConfigError, RunConfig};
use crate::model::scaling::{RopeScaling, ScalingError, ScalingKind, scaled_inv_freq};
use crate::results::{self, ResultsError, TableBuilder};
use crate::train;

/// Errors of `lab eval`.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// Loading the checkpoint.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// An override or the new length is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The scaling parameters are invalid (named as the command-line flags that set them; not
    /// a `#[source]`, so that a printed error chain does not repeat it under its field name).
    #[error("{}", .0.for_cli())]
    Scaling(ScalingError),
    /// A scaling asked of a run whose encoding has no rotary frequencies to scale.
    #[error("--scaling {0}")]
    NotScalable(String),
    /// Writing tables.
    #[error(transparent)]
    Results(#[from] ResultsError),
    /// A `--set key=value` that is not a config field or does not parse.
    #[error("--set {0}")]
    Override(String),
    /// The evaluation length is out of range for the run (its message names `--seq-len`).
    #[error("{0}")]
    SeqLen(String),
    /// An ablation that does not apply to the run.
    #[error("--ablate-pairs {0}")]
    Ablate(String),
}

impl From<ScalingError> for EvalError {
    fn from(e: ScalingError) -> Self {
        EvalError::Scaling(e)
    }
}

/// What to evaluate.
#[derive(Clone, Debug)]
pub struct EvalRequest {
    /// Context length of the evaluation, tokens.
    pub seq_len: usize,
    /// RoPE scaling (`kind = none` for plain). `original_max_len` is set to the training length.
    pub scaling: RopeScaling,
    /// Task parameter overrides, `key=value` (config field names).
    pub overrides: Vec<String>,
    /// Name recorded in the table's `eval_name` column (`adhoc` from `lab eval`; the
    /// `[[evals]]` entry's name in a sweep).
    pub name: String,
    /// Rotary pairs whose frequency is set to 0 for this evaluation (the causal check,
    /// SCIENCE.md §8); RoPE runs only.
    pub ablate: Option<Ablation>,
}

impl EvalRequest {
    /// `lab eval`'s request: `seq_len` tokens, `scaling` (its original length is set from the
    /// run), `key=value` overrides, and the rotary pairs to set to θ = 0 (none when empty).
    pub fn adhoc(
        seq_len: usize,
        scaling: RopeScaling,
        overrides: Vec<String>,
        ablate_pairs: Vec<usize>,
    ) -> Self {
        EvalRequest {
            seq_len,
            scaling,
            overrides,
            name: "adhoc".to_string(),
            ablate: (!ablate_pairs.is_empty()).then(|| Ablation {
                band: "pairs".to_string(),
                pairs: ablate_pairs,
            }),
        }
    }
}

/// An ablation: rotary pairs evaluated with `θ_i = 0` (NoPE pairs; their q/k content is kept).
#[derive(Clone, Debug, PartialEq)]
pub struct Ablation {
    /// Label in the `evals` table's `ablate_band` column (`law`, `far`, or `pairs` from the CLI).
    pub band: String,
    /// Pair indices `i` (0-based, `θ_i = base^(−2i/head_dim)`).
    pub pairs: Vec<usize>,
}

/// Result of one evaluation.
#[derive(Clone, Debug)]
pub struct EvalOutcome {
    /// The config evaluated (training config with the new length and overrides).
    pub config: RunConfig,
    /// Training context length.
    pub train_seq_len: usize,
    /// Loss on scored positions, nats.
    pub loss: f64,
    /// Accuracy on scored positions.
    pub accuracy: f64,
    /// θ_eff of the pooled spectrum at this length (on the unscaled grid).
    pub effective_freq: f64,
    /// θ_eff of each layer's spectrum at this length (index = layer; radians per token; R1's
    /// `layer:<l>` pooling).
    pub layer_effective_freq: Vec<f64>,
    /// RoPE attention factor applied.
    pub attention_factor: f64,
    /// Identity of this evaluation (hash of run id, length, scaling, overrides, ablation).
    pub eval_id: String,
    /// The ablation applied, if any.
    pub ablate: Option<Ablation>,
    /// iGSM runs: answer accuracy of greedy-decoded solutions of the first
    /// `min(eval_batches · batch_size, 256)` held-out problems of the evaluated config, with this
    /// evaluation's scaling applied ([`crate::decode::igsm_generation`]); `None` for other tasks.
    pub answer_accuracy: Option<f64>,
    /// iGSM runs: the share of those decoded solutions that pass the checker.
    pub solution_valid: Option<f64>,
    /// iGSM runs: teacher-forced accuracy on the same problems' solution characters by
    /// [`crate::decode::SolutionRole`] (`SolutionRole::ALL` order; NaN for a role with no
    /// character). Printed by `lab eval`, not written to the table.
    pub solution_role_accuracy: Option<[f64; 8]>,
    /// iGSM runs: `(problems, right answers)` of the greedy decoding by the depth of each
    /// problem's dependency tree ([`crate::decode::IgsmGeneration::by_depth`]). Printed by `lab
    /// eval`, not written to the table.
    pub answers_by_depth: Option<Vec<(usize, usize)>>,
    /// iGSM runs: where each wrong greedy solution first leaves the reference
    /// ([`crate::decode::IgsmGeneration::first_errors`]). Printed by `lab eval`, not written to
    /// the table.
    pub first_errors: Option<Vec<crate::decode::FirstError>>,
}

/// The JSON summary of the first divergences of wrong greedy solutions
/// ([`crate::decode::first_divergence`]): `wrong` (how many), counts `by_role`
/// ([`crate::decode::SolutionRole`] names), `by_kind` (the reference step a divergence falls in: a
/// leaf step, an operation step, or the final `#answer.`), `by_step` (step index from 0, only
/// steps with a divergence), and the `cases` themselves in problem order, each with its reference
/// and generated completions.
pub fn first_errors_json(cases: &[crate::decode::FirstError]) -> serde_json::Value {
    use crate::decode::SolutionRole;
    let errors: Vec<_> = cases.iter().map(|c| c.divergence).collect();
    let by_role: serde_json::Map<_, _> = SolutionRole::ALL
        .iter()
        .map(|&r| {
            let n = errors.iter().filter(|e| e.role == r).count();
            (r.name().to_string(), serde_json::json!(n))
        })
        .collect();
    let answer = errors.iter().filter(|e| e.step == e.steps).count();
    let leaf = errors.iter().filter(|e| e.leaf_step).count();
    let max_step = errors.iter().map(|e| e.step).max();
    let by_step: Vec<_> = max_step
        .map_or(0..0, |m| 0..m + 1)
        .filter_map(|k| {
            let n = errors.iter().filter(|e| e.step == k).count();
            (n > 0).then(|| serde_json::json!({"step": k, "wrong": n}))
        })
        .collect();
    let cases: Vec<_> = cases
        .iter()
        .map(|c| {
            let e = c.divergence;
            serde_json::json!({"index": e.index, "role": e.role.name(), "step": e.step,
                "steps": e.steps, "leaf_step": e.leaf_step, "reference": c.reference,
                "generated": c.generated})
        })
        .collect();
    serde_json::json!({
        "wrong": errors.len(), "by_role": by_role,
        "by_kind": {"leaf_step": leaf, "operation_step": errors.len() - leaf - answer, "answer": answer},
        "by_step": by_step, "cases": cases,
    })
}

impl EvalOutcome {
    /// The JSON object `lab eval` prints for request `req`: ids, lengths, scaling, attention
    /// factor, loss (nats), accuracy, θ_eff (radians per token) pooled and per layer, the ablated
    /// pairs, and for iGSM
    /// runs the greedy answer accuracy, the valid-solution share, the teacher-forced accuracy by
    /// role, the greedy answers by dependency depth and where the wrong solutions first leave the
    /// reference ([`first_errors_json`]) (null otherwise).
    pub fn json(&self, req: &EvalRequest) -> serde_json::Value {
        serde_json::json!({
            "eval_id": self.eval_id, "seq_len": self.config.seq_len,
            "train_seq_len": self.train_seq_len, "scaling": req.scaling.kind,
            "factor": req.scaling.factor, "attention_factor": self.attention_factor,
            "loss": self.loss, "accuracy": self.accuracy, "effective_freq": self.effective_freq,
            "layer_effective_freq": self.layer_effective_freq,
            "ablated_pairs": self.ablate.as_ref().map(|a| a.pairs.clone()),
            "answer_accuracy": self.answer_accuracy, "solution_valid": self.solution_valid,
            "acc_tf": self.solution_role_accuracy.map(|a| {
                crate::decode::SolutionRole::ALL
                    .iter()
                    .zip(a)
                    .map(|(r, x)| (r.name().to_string(), serde_json::json!(x)))
                    .collect::<serde_json::Map<_, _>>()
            }),
            "answers_by_depth": self.answers_by_depth.as_ref().map(|cells| {
                cells
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.0 > 0)
                    .map(|(depth, &(n, right))| {
                        serde_json::json!({
                            "depth": depth, "problems": n,
                            "answer_accuracy": right as f64 / n as f64,
                        })
                    })
                    .collect::<Vec<_>>()
            }),
            "first_errors": self.first_errors.as_deref().map(first_errors_json),
        })
    }
}

/// The config fields an evaluation may change (`lab eval --set`, `[[evals]]` `set` and
/// `scale_params`): the data's task parameters, how much of it is evaluated, and which (equal)
/// implementation computes attention. Everything else is fixed by the trained model (its
/// shape, encoding and vocabulary) or is about training only, and is refused by name instead of
/// being recorded as if it had been applied.
pub const EVAL_SETTABLE: &[&str] = &[
    "variant",
    "block_len",
    "noise",
    "min_letters",
    "max_letters",
    "max_shift",
    "ops",
    "distractors",
    "min_ops",
    "needle_depth",
    "key_len",
    "value_len",
    "haystack",
    "eval_batches",
    "batch_size",
    "seed",
    "attention",
];

/// Apply `key=value` overrides to a config (values parsed as TOML scalars); only
/// [`EVAL_SETTABLE`] fields.
pub fn apply_overrides(cfg: &RunConfig, overrides: &[String]) -> Result<RunConfig, EvalError> {
    let mut value = toml::Value::try_from(cfg).expect("config serialises to TOML");
    let table = value.as_table_mut().expect("config is a table");
    let fields = crate::config::fields();
    for o in overrides {
        let (k, v) = o
            .split_once('=')
            .ok_or_else(|| EvalError::Override(format!("{o}: expected key=value")))?;
        let k = k.trim();
        if !fields.contains(&k) {
            return Err(EvalError::Override(format!(
                "{o}: unknown key `{k}`{}",
                crate::hint::did_you_mean(k, fields.iter().copied())
            )));
        }
        if !EVAL_SETTABLE.contains(&k) {
            return Err(EvalError::Override(format!(
                "{o}: `{k}` is fixed by the trained model and cannot change at evaluation; \
                 --set changes the evaluation data only: {}",
                EVAL_SETTABLE.join(", ")
            )));
        }
        let parsed: toml::Value = format!("x = {}", v.trim())
            .parse::<toml::Table>()
            .map(|mut t| t.remove("x").unwrap())
            .unwrap_or_else(|_| toml::Value::String(v.trim().to_string()));
        table.insert(k.to_string(), parsed);
    }
    let toml::Value::Table(table) = value else {
        unreachable!("config is a table")
    };
    crate::config::from_toml(table).map_err(EvalError::Override)
}

/// Evaluate the checkpoint at `path` (see module docs) and write its `evals` row.
pub fn eval_checkpoint(
    path: &Path,
    req: &EvalRequest,
    device: &Device,
) -> Result<EvalOutcome, EvalError> {
    let (train_cfg, model) = checkpoint::load(path, device)?;
    let (out, scaling) = eval_model(&train_cfg, model, req, device)?;
    let dir = checkpoint_dir(path);
    write_eval(&dir, &train_cfg, &out, &scaling, &req.name)?;
    // In a sweep folder (…/runs/<id>/), refresh the sweep-level evals table.
    if let Some(runs) = dir
        .parent()
        .filter(|p| p.file_name().is_some_and(|n| n == "runs"))
    {
        let sweep_dir = runs.parent().unwrap_or(Path::new("."));
        // The folder's plan only, when it records one (crate::results::plan).
        let plan = crate::results::plan::read(sweep_dir);
        let mut run_dirs: Vec<PathBuf> = std::fs::read_dir(runs)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                plan.as_ref().is_none_or(|p| {
                    p.run_ids
                        .iter()
                        .any(|id| *id == e.file_name().to_string_lossy())
                })
            })
            .map(|e| e.path())
            .collect();
        run_dirs.sort();
        let files = eval_files(&run_dirs);
        results::merge_tables(&files, &sweep_dir.join("evals.parquet"))?;
    }
    Ok(out)
}

/// Evaluate a trained `model` (on the plain, non-autodiff `device`) of `train_cfg` as `req`
/// says. Returns the outcome and the scaling actually applied.
pub fn eval_model(
    train_cfg: &RunConfig,
    model: crate::model::Transformer,
    req: &EvalRequest,
    device: &Device,
) -> Result<(EvalOutcome, RopeScaling), EvalError> {
    let mut cfg = apply_overrides(train_cfg, &req.overrides)?;
    // Which input a failure is due to: the overrides at the trained length, else the length.
    if !req.overrides.is_empty() {
        let mut at_train_len = cfg.clone();
        at_train_len.seq_len = train_cfg.seq_len;
        at_train_len
            .validate()
            .map_err(|e| EvalError::Override(format!("{}: {e}", req.overrides.join(" --set "))))?;
    }
    cfg.seq_len = req.seq_len;
    cfg.validate()
        .map_err(|e| EvalError::SeqLen(format!("--seq-len {}: {e}", req.seq_len)))?;
    let mut scaling = req.scaling.clone();
    scaling.original_max_len = train_cfg.seq_len;
    if scaling.kind == ScalingKind::Dynamic && scaling.seq_len.is_none() {
        scaling.seq_len = Some(req.seq_len);
    }
    if scaling.kind != ScalingKind::None && !cfg.encoding.rope_scalable() {
        return Err(EvalError::NotScalable(format!(
            "{} has no effect on this run: its encoding is {}, and scalings apply to RoPE runs only (hybrid RoPE/NoPE stacks included); leave --scaling out",
            scaling.kind.name(),
            cfg.encoding.name()
        )));
    }
    let mut freqs = scaled_inv_freq(cfg.head_dim(), cfg.rope_base, &scaling)?;
    if let Some(a) = &req.ablate {
        if !cfg.encoding.rope_scalable() {
            return Err(EvalError::Ablate(format!(
                "applies to RoPE runs only; this run's encoding is {}",
                cfg.encoding.name()
            )));
        }
        let n = freqs.inv_freq.len();
        if let Some(&bad) = a.pairs.iter().find(|&&i| i >= n) {
            return Err(EvalError::Ablate(format!(
                "pair {bad} is out of range: must be in 0..={} (head_dim / 2 − 1)",
                n - 1
            )));
        }
        for &i in &a.pairs {
            freqs.inv_freq[i] = 0.0;
        }
    }
    let model = if cfg.encoding.rope_scalable() {
        model.with_scaling(&freqs)
    } else {
        model
    };
    let mut ticker = Ticker::new(format!("eval at seq_len {}", cfg.seq_len), "examples");
    let ev = train::evaluate_with_progress(&model, &cfg, device, &mut |d, t| ticker.tick(d, t));
    let generation = (cfg.task.kind() == crate::config::TaskKind::Igsm).then(|| {
        let n = (cfg.eval_batches * cfg.batch_size).min(256);
        if ticker.is_long() {
            eprintln!(
                "{}: greedy decoding of {n} held-out problems …",
                ticker.what
            );
        }
        let held_out = crate::decode::ProblemSet::HeldOut;
        let g = crate::decode::igsm_generation(&model, &cfg, device, n, held_out);
        let by_role = crate::decode::igsm_accuracy_by_role(&model, &cfg, device, n, held_out);
        (
            g,
            by_role.map(|(scored, right)| right as f64 / scored as f64),
        )
    });
    let eval_id = {
        let mut h = blake3::Hasher::new();
        h.update(train_cfg.run_id().as_bytes());
        h.update(req.name.as_bytes());
        h.update(cfg.canonical_json().as_bytes());
        h.update(serde_json::to_string(&scaling).unwrap().as_bytes());
        if let Some(a) = &req.ablate {
            h.update(format!("ablate {} {:?}", a.band, a.pairs).as_bytes());
        }
        h.finalize().to_hex()[..16].to_string()
    };
    // The generation's parts, moved out of it (not cloned).
    let (answer_accuracy, solution_valid, answers_by_depth, first_errors, solution_role_accuracy) =
        match generation {
            Some((g, by_role)) => (
                Some(g.answer_accuracy),
                Some(g.solution_valid),
                Some(g.by_depth),
                Some(g.first_errors),
                Some(by_role),
            ),
            None => (None, None, None, None, None),
        };
    let out = EvalOutcome {
        train_seq_len: train_cfg.seq_len,
        loss: ev.loss,
        accuracy: ev.accuracy,
        effective_freq: ev.summary.effective_freq,
        layer_effective_freq: train::layer_effective_freqs(&ev.energy, &cfg.freq_grid()),
        attention_factor: if cfg.encoding.rope_scalable() {
            freqs.attention_factor
        } else {
            1.0
        },
        eval_id,
        config: cfg,
        ablate: req.ablate.clone(),
        answer_accuracy,
        solution_valid,
        answers_by_depth,
        first_errors,
        solution_role_accuracy,
    };
    Ok((out, scaling))
}

/// Progress lines on stderr for work that can take long (issue 51, item 9): at most one every
/// [`Ticker::EVERY_S`] seconds (`$LAB_PROGRESS_EVERY_S` sets another interval; 0 prints one
/// per step of the work), none for work that ends sooner, each with the share done, the time so
/// far and an estimate of the time left (`eval at seq_len 65536: 12/32 examples, 4.1 min, about
/// 6.8 min left`).
pub struct Ticker {
    /// What is being done (the line's start).
    pub what: String,
    /// The unit counted.
    unit: &'static str,
    /// When the work started.
    pub started: std::time::Instant,
    last: std::time::Instant,
    every_s: f64,
}

impl Ticker {
    /// Seconds between two progress lines (and before the first), unless
    /// `$LAB_PROGRESS_EVERY_S` says otherwise.
    pub const EVERY_S: f64 = 10.0;

    /// A ticker for `what`, counting `unit`s, started now.
    pub fn new(what: String, unit: &'static str) -> Self {
        let now = std::time::Instant::now();
        let every_s = std::env::var("LAB_PROGRESS_EVERY_S")
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v >= 0.0)
            .unwrap_or(Self::EVERY_S);
        Ticker {
            what,
            unit,
            started: now,
            last: now,
            every_s,
        }
    }

    /// Whether the work has run longer than the interval (later messages worth a line).
    pub fn is_long(&self) -> bool {
        self.started.elapsed().as_secs_f64() > self.every_s
    }

    /// `done` of `total` units are done: a line if the last one is the interval old.
    pub fn tick(&mut self, done: usize, total: usize) {
        if self.last.elapsed().as_secs_f64() < self.every_s || done == 0 {
            return;
        }
        self.last = std::time::Instant::now();
        let spent = self.started.elapsed().as_secs_f64();
        let left = spent / done as f64 * total.saturating_sub(done) as f64;
        eprintln!(
            "{}: {done}/{total} {}, {:.1} min, about {:.1} min left",
            self.what,
            self.unit,
            spent / 60.0,
            left / 60.0
        );
    }
}

/// Write one evaluation's row to `<run dir>/evals/<eval_id>.parquet`.
pub fn write_eval(
    run_dir: &Path,
    train_cfg: &RunConfig,
    out: &EvalOutcome,
    scaling: &RopeScaling,
    name: &str,
) -> Result<(), EvalError> {
    let table = evals_row(train_cfg, out, scaling, name);
    results::write_batch(
        &run_dir
            .join("evals")
            .join(format!("{}.parquet", out.eval_id)),
        &table,
    )?;
    Ok(())
}

/// Every `<run dir>/evals/*.parquet` of `run_dirs`, in run order, sorted within a run.
pub fn eval_files(run_dirs: &[PathBuf]) -> Vec<PathBuf> {
    run_dirs
        .iter()
        .flat_map(|d| {
            let mut f: Vec<PathBuf> = std::fs::read_dir(d.join("evals"))
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
                .collect();
            f.sort();
            f
        })
        .collect()
}

fn checkpoint_dir(path: &Path) -> PathBuf {
    if path.is_file() {
        path.parent().unwrap_or(Path::new(".")).to_path_buf()
    } else {
        path.to_path_buf()
    }
}

/// The one-row `evals` table.
pub fn evals_row(
    train_cfg: &RunConfig,
    out: &EvalOutcome,
    scaling: &RopeScaling,
    name: &str,
) -> RecordBatch {
    let kind = serde_json::to_value(scaling.kind)
        .unwrap()
        .as_str()
        .unwrap()
        .to_string();
    // The evaluated task's parameters (null where the task has no such parameter).
    let flat = out.config.flat();
    let flat_str = |k: &str| flat.get(k).and_then(|v| v.as_str()).map(str::to_string);
    TableBuilder::new(1)
        .str("run_id", vec![train_cfg.run_id()])
        .str("eval_id", vec![out.eval_id.clone()])
        .str("eval_name", vec![name.to_string()])
        .str("task", vec![out.config.task.kind().name().to_string()])
        .opt_str("variant", vec![flat_str("variant")])
        .str("encoding", vec![out.config.encoding.name().to_string()])
        .opt_str("corpus", vec![flat_str("corpus")])
        .i64("train_seq_len", vec![out.train_seq_len as i64])
        .i64("seq_len", vec![out.config.seq_len as i64])
        .f64(
            "length_ratio",
            vec![out.config.seq_len as f64 / out.train_seq_len as f64],
        )
        .opt_i64(
            "block_len",
            vec![flat.get("block_len").and_then(|v| v.as_i64())],
        )
        .str("scaling", vec![kind])
        .f64("factor", vec![scaling.factor])
        .f64("attention_factor", vec![out.attention_factor])
        .f64("loss", vec![out.loss])
        .f64("accuracy", vec![out.accuracy])
        .f64("effective_freq", vec![out.effective_freq])
        .opt_f64("answer_accuracy", vec![out.answer_accuracy])
        .opt_f64("solution_valid", vec![out.solution_valid])
        .str(
            "ablate_band",
            vec![
                out.ablate
                    .as_ref()
                    .map(|a| a.band.clone())
                    .unwrap_or_default(),
            ],
        )
        .str(
            "ablated_pairs",
            vec![
                out.ablate
                    .as_ref()
                    .map(|a| {
                        a.pairs
                            .iter()
                            .map(|i| i.to_string())
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .unwrap_or_default(),
            ],
        )
        .i64("seed", vec![train_cfg.seed as i64])
        .str("config_json", vec![out.config.canonical_json()])
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::first_divergence;

    /// Three wrong solutions of `a=5;b=3;c=a+b=5+3=8;#8.` counted by role, kind and step.
    #[test]
    fn first_errors_json_counts_hand_cases() {
        let r = "a=5;b=3;c=a+b=5+3=8;#8.";
        let errors: Vec<_> = ["a=5;d=3;", "a=5;b=3;c=a*b=5*3=15;#15.", "a=5;e=1;"]
            .iter()
            .map(|g| crate::decode::FirstError {
                divergence: first_divergence(r, g).unwrap(),
                reference: r.to_string(),
                generated: g.to_string(),
            })
            .collect();
        let j = first_errors_json(&errors);
        assert_eq!(j["wrong"], 3);
        assert_eq!(j["by_role"]["name"], 2);
        assert_eq!(j["by_role"]["operator"], 1);
        assert_eq!(j["by_role"]["leaf"], 0);
        assert_eq!(j["by_kind"]["leaf_step"], 2);
        assert_eq!(j["by_kind"]["operation_step"], 1);
        assert_eq!(j["by_kind"]["answer"], 0);
        assert_eq!(
            j["by_step"],
            serde_json::json!([{"step": 1, "wrong": 2}, {"step": 2, "wrong": 1}])
        );
        assert_eq!(j["cases"][1]["index"], 11);
        assert_eq!(j["cases"][2]["generated"], "a=5;e=1;");
        assert_eq!(j["cases"].as_array().unwrap().len(), 3);
    }
}

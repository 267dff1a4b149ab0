//! A run's fully resolved configuration: task, model, positional encoding, training, seed.
//!
//! A run is identified by the hash of this struct's canonical JSON serialisation plus the lab's
//! [`SCHEMA_VERSION`](SCHEMA_VERSION) (see [`RunConfig::run_id`]); every field is
//! therefore part of a run's identity. Sweep files (`sweeps/*.toml`) set these fields by name;
//! unknown names are rejected with the closest valid one.

use serde::{Deserialize, Serialize};
use tasks::{Example, Split, TaskError};

use crate::model::{AttentionKernel, Encoding, EncodingConfig, ModelConfig, PairLayout};

/// Training examples profiled by [`RunConfig::data_width_mi`].
pub const RUN_WIDTH_EXAMPLES: usize = 256;

pub use crate::hint::did_you_mean;
pub use crate::store::SCHEMA_VERSION;
pub use crate::task::{CORPUS_EVAL_FRACTION, CORPUS_VAL_FRACTION, TaskConfig, TaskGen, TaskKind};

/// Error for an invalid configuration value: one line naming the field and its allowed range.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    /// A field outside its allowed range.
    #[error("{field} = {value} is out of range: {allowed}")]
    OutOfRange {
        /// Field name as written in sweep files.
        field: String,
        /// The offending value, printed.
        value: String,
        /// The allowed range, in words.
        allowed: String,
    },
    /// The task generator rejected its parameters (its message names the field).
    #[error("{0}")]
    Task(String),
}

impl ConfigError {
    fn new(field: &str, value: impl std::fmt::Display, allowed: impl Into<String>) -> Self {
        Self::OutOfRange {
            field: field.into(),
            value: value.to_string(),
            allowed: allowed.into(),
        }
    }
}

/// [`RunConfig`]'s field names in declaration order (checked by a test); `task` names the task,
/// whose own parameters are listed by [`crate::task`], and `encoding` the encoding, whose own
/// parameters are listed by its [`crate::model::EncodingParams`] type.
pub const RUN_FIELDS: &[&str] = &[
    "task",
    "vocab_size",
    "seq_len",
    "encoding",
    "rope_base",
    "pair_layout",
    "d_model",
    "n_layers",
    "n_heads",
    "d_ff",
    "steps",
    "batch_size",
    "lr",
    "warmup_steps",
    "min_lr_ratio",
    "weight_decay",
    "beta1",
    "beta2",
    "adam_eps",
    "grad_clip",
    "eval_every",
    "eval_batches",
    "seed",
    "train_examples",
    "attention",
    "max_grad_norm",
    "stop",
    "min_steps",
    "stop_window",
    "stop_tol",
    "nope_every",
    "answer_curve",
    "canon_len",
    "answer_curve_min_ops",
];

/// Every key a sweep file or `--set` may give a run: [`RUN_FIELDS`], then every task's own
/// parameters in registry order ([`crate::task::all_params`]), then every encoding's
/// ([`crate::model::all_encoding_params`]).
pub fn fields() -> Vec<&'static str> {
    let mut f = RUN_FIELDS.to_vec();
    f.extend(crate::task::all_params());
    f.extend(crate::model::all_encoding_params());
    f
}
/// Default [`RunConfig::max_grad_norm`]: orders of magnitude above the gradient norms of a
/// run that trains (clipping is at `grad_clip`, typically 1).
pub const DEFAULT_MAX_GRAD_NORM: f64 = 1e6;

/// When a run stops training (docs/analysis-rules.md, R3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StopRule {
    /// After `steps` optimiser steps.
    #[default]
    Steps,
    /// When every layer's θ_eff has stopped moving: at an evaluation at step ≥ `min_steps`, the
    /// spread (max − min) of `ln θ_eff` of each layer's spectrum over the last `stop_window + 1`
    /// evaluations is at most `stop_tol`; at most `steps` steps.
    Spectrum,
}

impl StopRule {
    fn is_steps(&self) -> bool {
        *self == StopRule::Steps
    }
}

fn is_zero_usize(v: &usize) -> bool {
    *v == 0
}
fn default_stop_window() -> usize {
    3
}
fn is_default_stop_window(v: &usize) -> bool {
    *v == default_stop_window()
}
fn default_stop_tol() -> f64 {
    0.05
}
fn is_default_stop_tol(v: &f64) -> bool {
    *v == default_stop_tol()
}
fn default_max_grad_norm() -> f64 {
    DEFAULT_MAX_GRAD_NORM
}

/// Every setting of one training run. Units: lengths in tokens, `lr` per step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// The task and its own parameters ([`crate::task`]); in sweep files `task = "block"` with
    /// the task's parameters as flat keys beside it.
    pub task: TaskConfig,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Context length (tokens per training sequence).
    pub seq_len: usize,
    /// The positional encoding and its own parameters ([`EncodingConfig`]); in sweep files
    /// `encoding = "tapa"` with the encoding's parameters as flat keys beside it.
    pub encoding: EncodingConfig,
    /// RoPE base: the reference frequency grid of every encoding (see
    /// [`ModelConfig::rope_base`]).
    pub rope_base: f64,
    /// RoPE pair layout (also how the probe reads NoPE's pairs).
    pub pair_layout: PairLayout,
    /// Residual width.
    pub d_model: usize,
    /// Number of blocks.
    pub n_layers: usize,
    /// Attention heads.
    pub n_heads: usize,
    /// MLP hidden width.
    pub d_ff: usize,
    /// Optimiser steps.
    pub steps: usize,
    /// Sequences per step.
    pub batch_size: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Linear warm-up steps (then cosine decay to `min_lr_ratio · lr` at `steps`).
    pub warmup_steps: usize,
    /// Final learning rate as a fraction of `lr`.
    pub min_lr_ratio: f64,
    /// Decoupled weight decay (AdamW), applied to matrices only.
    pub weight_decay: f64,
    /// AdamW β₁.
    pub beta1: f64,
    /// AdamW β₂.
    pub beta2: f64,
    /// AdamW ε.
    pub adam_eps: f64,
    /// Global gradient-norm clip (0 disables).
    pub grad_clip: f64,
    /// Evaluate (and probe) every this many steps, and at the last step.
    pub eval_every: usize,
    /// Held-out batches per evaluation (each `batch_size` sequences).
    pub eval_batches: usize,
    /// Seed for data (train and eval streams derived from it) and initial weights.
    pub seed: u64,
    /// Size of the training set: example indices wrap modulo this (several passes over a fixed
    /// set, as in the papers); 0 = an endless stream of fresh examples.
    #[serde(default)]
    pub train_examples: u64,
    /// Attention implementation: `fused` (default) or `reference` (same maths, burn ops).
    #[serde(default)]
    pub attention: AttentionKernel,
    /// Divergence guard: a pre-clip global gradient norm above this stops the run as failed
    /// (exploding gradients), like a non-finite loss or gradient norm does; 0 disables it.
    #[serde(default = "default_max_grad_norm")]
    pub max_grad_norm: f64,
    /// Stopping rule: `steps` (default: train `steps` steps) or `spectrum` (stop when every
    /// layer's θ_eff has converged, docs/analysis-rules.md R3; `steps` is then the cap).
    /// The four stopping fields are serialised only when not at their defaults, so the ids of
    /// runs that do not use them are unchanged.
    #[serde(default, skip_serializing_if = "StopRule::is_steps")]
    pub stop: StopRule,
    /// `stop = "spectrum"`: no stop before this many steps.
    #[serde(default, skip_serializing_if = "is_zero_usize")]
    pub min_steps: usize,
    /// `stop = "spectrum"`: evaluations (after the first) over which θ_eff must hold still.
    #[serde(
        default = "default_stop_window",
        skip_serializing_if = "is_default_stop_window"
    )]
    pub stop_window: usize,
    /// `stop = "spectrum"`: largest spread of `ln θ_eff` (≈ relative change) over the window.
    #[serde(
        default = "default_stop_tol",
        skip_serializing_if = "is_default_stop_tol"
    )]
    pub stop_tol: f64,
    /// Hybrid layers: every `nope_every`-th layer uses NoPE, the others `encoding` (Llama 4
    /// interleaves NoPE every 4th layer); 0 = none.
    #[serde(default, skip_serializing_if = "is_zero_usize")]
    pub nope_every: usize,
    /// iGSM: greedy-decode this many held-out problems at every evaluation after step 0, for a
    /// learning curve of answer accuracy (`curves.answer_accuracy`; [`crate::decode`]); 0
    /// (default, not serialised) decodes only once, at the end. Each decoding costs one forward
    /// pass per generated character.
    #[serde(default, skip_serializing_if = "is_zero_usize")]
    pub answer_curve: usize,
    /// Width of the causal depthwise convolution before each attention ("Canon-A",
    /// [`crate::model::Block::canon`]): every position adds a learned, per-channel mix of its
    /// normalised input and the `canon_len − 1` before it. 0 (default, not serialised) = none.
    /// Every attention implementation has it (the fast path since 2026-12-04).
    #[serde(default, skip_serializing_if = "is_zero_usize")]
    pub canon_len: usize,
    /// iGSM with `answer_curve > 0`: at every evaluation also greedy-decode `answer_curve` held-out
    /// problems of exactly `answer_curve_min_ops`, …, `ops − 1` operations (same model, same
    /// weights), one learning curve per size (`curves` rows with `split = "answers"` and
    /// `answer_ops`). 0 (default, not serialised): the run's own `ops` only. In `2..=ops` (a
    /// single operation has too few solution shapes for held-out ones).
    #[serde(default, skip_serializing_if = "is_zero_usize")]
    pub answer_curve_min_ops: usize,
}

/// A [`RunConfig`] from a TOML table (a sweep's resolved run, or a run config after `--set`).
///
/// # Errors
/// One line naming the field: `steps: invalid type: string "four", expected usize`, or serde's
/// unknown-field message with the closest field name appended.
pub fn from_toml(table: toml::Table) -> Result<RunConfig, String> {
    let table = crate::task::nest_task_fields(table)?;
    let table = nest_encoding_fields(table)?;
    serde_path_to_error::deserialize(toml::Value::Table(table))
        .map_err(|e| crate::hint::at_field(&e.path().to_string(), e.inner().message()))
}

/// A [`RunConfig`] from flat JSON (the keys of a sweep file, the task's parameters beside
/// `task`), as [`from_toml`] reads a sweep's table.
///
/// # Errors
/// One line naming the field, as [`from_toml`].
pub fn from_flat_json(value: serde_json::Value) -> Result<RunConfig, String> {
    let table = toml::Table::try_from(value).map_err(|e| e.to_string())?;
    from_toml(table)
}

impl RunConfig {
    /// A run config from its JSON (a run folder's `config.json`, a run's `config_json`).
    ///
    /// # Errors
    /// One line: a config written by a lab of schema 1 (every task's parameters flat beside
    /// `task`, before tasks had their own section) or of schema 2 (encoding parameters beside
    /// `encoding`), or serde's message naming the field.
    pub fn from_json(text: &str) -> Result<RunConfig, String> {
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let old = if value.get("task").is_some_and(|t| t.is_string()) {
            Some("1 (an older lab, task parameters beside `task`)")
        } else if value.get("encoding").is_some_and(|t| t.is_string()) {
            Some("2 (an older lab, encoding parameters beside `encoding`)")
        } else {
            None
        };
        if let Some(old) = old {
            return Err(format!(
                "a run config of schema {old}; this lab reads schema {SCHEMA_VERSION}: run its \
                 sweep again (the runs get new ids)"
            ));
        }
        serde_path_to_error::deserialize(value)
            .map_err(|e| crate::hint::at_field(&e.path().to_string(), &e.inner().to_string()))
    }

    /// Check every field; the first violation is returned as a one-line [`ConfigError`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        fn range<T: PartialOrd + std::fmt::Display + Copy>(
            field: &str,
            v: T,
            lo: T,
            hi: T,
        ) -> Result<(), ConfigError> {
            if v < lo || v > hi {
                return Err(ConfigError::new(
                    field,
                    v,
                    format!("must be in {lo}..={hi}"),
                ));
            }
            Ok(())
        }
        range("vocab_size", self.vocab_size, 2, 1 << 20)?;
        range("seq_len", self.seq_len, 2, tasks::MAX_SEQ_LEN)?;
        range("d_model", self.d_model, 2, 1 << 14)?;
        range("n_layers", self.n_layers, 1, 256)?;
        range("n_heads", self.n_heads, 1, self.d_model)?;
        if self.d_model % self.n_heads != 0 {
            return Err(ConfigError::new(
                "n_heads",
                self.n_heads,
                format!("must divide d_model = {}", self.d_model),
            ));
        }
        if self.head_dim() % 2 != 0 {
            return Err(ConfigError::new(
                "n_heads",
                self.n_heads,
                format!(
                    "d_model / n_heads must be even for rotary pairs (d_model = {})",
                    self.d_model
                ),
            ));
        }
        range("d_ff", self.d_ff, 1, 1 << 16)?;
        range("steps", self.steps, 1, 100_000_000)?;
        range("batch_size", self.batch_size, 1, 1 << 16)?;
        open_closed_range("lr", self.lr, 0.0, 10.0)?;
        range("warmup_steps", self.warmup_steps, 0, self.steps)?;
        finite_range("min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)?;
        finite_range("weight_decay", self.weight_decay, 0.0, 10.0)?;
        finite_range("beta1", self.beta1, 0.0, 0.999_999)?;
        finite_range("beta2", self.beta2, 0.0, 0.999_999_9)?;
        open_closed_range("adam_eps", self.adam_eps, 0.0, 1.0)?;
        finite_range("grad_clip", self.grad_clip, 0.0, 1e6)?;
        range("eval_every", self.eval_every, 1, 100_000_000)?;
        range("eval_batches", self.eval_batches, 1, 10_000)?;
        if !(self.rope_base > 1.0 && self.rope_base <= crate::model::scaling::MAX_BASE) {
            return Err(ConfigError::new(
                "rope_base",
                self.rope_base,
                "must be a number in (1, 1e12]",
            ));
        }
        finite_range("max_grad_norm", self.max_grad_norm, 0.0, 1e30)?;
        range("min_steps", self.min_steps, 0, self.steps)?;
        range("stop_window", self.stop_window, 1, 1000)?;
        open_closed_range("stop_tol", self.stop_tol, 0.0, 10.0)?;
        self.encoding
            .validate(self.head_dim())
            .map_err(|(field, value, allowed)| ConfigError::new(field, value, allowed))?;
        range("nope_every", self.nope_every, 0, self.n_layers)?;
        range("canon_len", self.canon_len, 0, crate::model::MAX_CANON_LEN)?;
        range("answer_curve", self.answer_curve, 0, 1024)?;
        if self.answer_curve > 0 && self.task.kind() != TaskKind::Igsm {
            return Err(ConfigError::new(
                "answer_curve",
                self.answer_curve,
                "must be 0: answers are decoded for task igsm only",
            ));
        }
        if self.answer_curve_min_ops > 0 {
            let TaskConfig::Igsm(p) = &self.task else {
                return Err(ConfigError::new(
                    "answer_curve_min_ops",
                    self.answer_curve_min_ops,
                    "must be 0: answers are decoded for task igsm only",
                ));
            };
            if self.answer_curve == 0 {
                return Err(ConfigError::new(
                    "answer_curve_min_ops",
                    self.answer_curve_min_ops,
                    "must be 0 when answer_curve is 0 (no answer curve is decoded)",
                ));
            }
            // ops = 1 has no held-out structure (too few shapes to split).
            if p.ops < 2 {
                return Err(ConfigError::new(
                    "answer_curve_min_ops",
                    self.answer_curve_min_ops,
                    "must be 0 when ops < 2 (no smaller size has held-out problems)",
                ));
            }
            range("answer_curve_min_ops", self.answer_curve_min_ops, 2, p.ops)?;
        }
        let task = self.task();
        task.validate()
            .map_err(|e| ConfigError::Task(e.to_string()))?;
        if let Some(need) = task.vocab_needed()
            && self.vocab_size < need
        {
            return Err(ConfigError::new(
                "vocab_size",
                self.vocab_size,
                format!(
                    "must be ≥ {need} (the {} task's character vocabulary)",
                    self.task.kind().name()
                ),
            ));
        }
        Ok(())
    }

    /// The training examples of optimiser step `step` (indices `step·batch_size ..`, wrapped
    /// modulo `train_examples` when it is set).
    pub fn train_batch(&self, step: usize) -> Result<Vec<Example>, TaskError> {
        let task = self.task();
        let start = (step * self.batch_size) as u64;
        if self.train_examples == 0 {
            return task.batch(self.seed, Split::Train, start, self.batch_size);
        }
        let n = self.train_examples;
        let mut out = Vec::with_capacity(self.batch_size);
        let mut index = start % n;
        while out.len() < self.batch_size {
            let take = ((self.batch_size - out.len()) as u64).min(n - index) as usize;
            out.extend(task.batch(self.seed, Split::Train, index, take)?);
            index = (index + take as u64) % n;
        }
        Ok(out)
    }

    /// Per-head dimension.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads.max(1)
    }

    /// The run's data generator.
    pub fn task(&self) -> TaskGen {
        self.task.generator(self.vocab_size, self.seq_len)
    }

    /// The model config.
    pub fn model(&self) -> ModelConfig {
        ModelConfig {
            vocab_size: self.vocab_size,
            d_model: self.d_model,
            n_layers: self.n_layers,
            n_heads: self.n_heads,
            d_ff: self.d_ff,
            encoding: self.encoding.clone(),
            rope_base: self.rope_base,
            pair_layout: self.pair_layout,
            attention: self.attention,
            nope_every: self.nope_every,
            canon_len: self.canon_len,
        }
    }

    /// Dependency width `W` of the run's data in tokens ([`TaskConfig::dep_width`]; a corpus: measured from
    /// its MI profile, [`crate::mi::corpus_dep_width`]).
    pub fn dep_width(&self) -> usize {
        self.task
            .dep_width(self.vocab_size, self.seq_len)
            .unwrap_or_else(|| {
                // A corpus: the width measured from its MI profile up to `seq_len` lags
                // (`seq_len` when nothing is significant or the corpus is missing).
                self.task
                    .corpus()
                    .and_then(|p| {
                        crate::mi::corpus_dep_width(&p.corpus, &p.granularity, self.seq_len)
                    })
                    .unwrap_or(self.seq_len)
            })
    }

    /// The config as flat `key → value` pairs: the task's and the encoding's parameters beside
    /// the other fields, `task` and `encoding` holding their names (the form of sweep files and
    /// of the `runs` table's columns).
    pub fn flat(&self) -> serde_json::Map<String, serde_json::Value> {
        let serde_json::Value::Object(mut m) =
            serde_json::to_value(self).expect("RunConfig serialises")
        else {
            unreachable!("a struct serialises to an object")
        };
        m.remove("task");
        m.remove("encoding");
        m.extend(self.task.flat());
        m.extend(self.encoding.flat());
        m
    }

    /// The dependency width of the run's own training data from its MI profile
    /// (docs/analysis-rules.md, R4): [`RUN_WIDTH_EXAMPLES`] training examples of the run's seed,
    /// lags `1..seq_len−1` capped at the farthest input any scored target has (iGSM's solution
    /// ends before its padded context does), [`tasks::mi::MiConfig`]'s defaults otherwise
    /// (Miller–Madow, shuffled baseline, `width_frac` 0.1). `None` when no lag is significant or
    /// the profile cannot be computed (fewer than 4 lags: the shuffled baseline uses lags `1..=4`).
    pub fn data_width_mi(&self) -> Option<usize> {
        let examples = self
            .task()
            .batch(self.seed, tasks::Split::Train, 0, RUN_WIDTH_EXAMPLES)
            .ok()?;
        // Lags up to the context, but no further than the farthest input a scored target has
        // (iGSM scores only the solution, which ends well before the padded context's end).
        let reach = examples
            .iter()
            .filter_map(|e| e.mask.iter().rposition(|&m| m))
            .max()?
            + 1;
        let mi_cfg = tasks::mi::MiConfig {
            max_lag: self
                .seq_len
                .checked_sub(1)
                .map(|r| r.min(reach))
                .filter(|&r| r >= 4)?,
            ..tasks::mi::MiConfig::default()
        };
        tasks::mi::profile_examples(&examples, &mi_cfg)
            .ok()?
            .dep_width
    }

    /// How the probe reads this run's encoding, and each channel's frequency (the encoding's
    /// [`crate::model::PositionalEncoding::spectrum`]).
    pub fn spectrum(&self) -> crate::model::Spectrum {
        self.encoding.kind().spectrum(&self.model())
    }

    /// Frequencies (radians per token) the probe reports energy for, in `freq_index` order.
    pub fn freq_grid(&self) -> Vec<f64> {
        self.spectrum().freqs
    }

    /// Canonical JSON: the serde field order of this struct, compact.
    pub fn canonical_json(&self) -> String {
        serde_json::to_string(self).expect("RunConfig serialises")
    }

    /// Stable run id: the first 16 hex digits of BLAKE3(schema version ‖ canonical JSON), with
    /// the corpus split's validation fraction between them for corpus runs.
    pub fn run_id(&self) -> String {
        let mut hasher = blake3::Hasher::new();
        hasher.update(format!("lab-schema-{}\n", SCHEMA_VERSION).as_bytes());
        // Corpus runs since the validation part (2026-12-07, R58) train on a shorter part of
        // the stream: their ids differ from those of the earlier split, so no finished run of
        // it is taken for one of the new split. Other tasks' data did not change.
        if matches!(self.task, TaskConfig::Corpus(_)) {
            hasher.update(format!("corpus-val-fraction-{CORPUS_VAL_FRACTION}\n").as_bytes());
        }
        hasher.update(self.canonical_json().as_bytes());
        hasher.finalize().to_hex()[..16].to_string()
    }
}

/// Move a flat table's encoding parameters into its `encoding` section: `encoding = "tapa"`
/// with `tapa_alpha = 0.2` beside it becomes `encoding = { kind = "tapa", tapa_alpha = 0.2 }`.
/// An `encoding` that is already a section (a serialised run config) takes the flat keys over
/// its own, so `--set tapa_alpha=0.2` overrides a stored run's value. Without `encoding` the
/// table is returned as it is (serde then names the missing field).
///
/// # Errors
/// One line: an unknown encoding (with the closest name), or a parameter of another encoding
/// (`tapa_alpha` is a parameter of encoding tapa, not of this run's encoding rope).
pub fn nest_encoding_fields(table: toml::Table) -> Result<toml::Table, String> {
    let kinds: Vec<(&'static str, &'static [&'static str])> = Encoding::ALL
        .iter()
        .map(|e| (e.name(), e.params()))
        .collect();
    crate::section::nest(
        table,
        &crate::section::Section {
            key: "encoding",
            expected: "an encoding name",
            kinds: &kinds,
            required: false,
        },
    )
}

/// `v ∈ (lo, hi]` (NaN rejected), else a one-line error naming `field`.
fn open_closed_range(field: &str, v: f64, lo: f64, hi: f64) -> Result<(), ConfigError> {
    if !(v > lo && v <= hi) {
        return Err(ConfigError::new(
            field,
            v,
            format!("must be in ({lo}, {hi}]"),
        ));
    }
    Ok(())
}

fn finite_range(field: &str, v: f64, lo: f64, hi: f64) -> Result<(), ConfigError> {
    if !v.is_finite() || v < lo || v > hi {
        return Err(ConfigError::new(
            field,
            v,
            format!("must be in [{lo}, {hi}]"),
        ));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A small valid config used across the crate's tests.
    pub fn tiny() -> RunConfig {
        RunConfig {
            task: TaskConfig::Block(tasks::block::BlockParams {
                variant: tasks::block::BlockVariant::Copy,
                block_len: 4,
                noise: 0.0,
            }),
            vocab_size: 16,
            seq_len: 16,
            encoding: Encoding::Rope.into(),
            rope_base: 10000.0,
            pair_layout: PairLayout::Adjacent,
            d_model: 16,
            n_layers: 1,
            n_heads: 2,
            d_ff: 32,
            steps: 4,
            batch_size: 4,
            lr: 1e-3,
            warmup_steps: 1,
            min_lr_ratio: 0.1,
            weight_decay: 0.1,
            beta1: 0.9,
            beta2: 0.95,
            adam_eps: 1e-8,
            grad_clip: 1.0,
            eval_every: 2,
            eval_batches: 1,
            seed: 0,
            train_examples: 0,
            attention: AttentionKernel::Fused,
            max_grad_norm: DEFAULT_MAX_GRAD_NORM,
            stop: StopRule::Steps,
            min_steps: 0,
            stop_window: 3,
            stop_tol: 0.05,
            nope_every: 0,
            answer_curve: 0,
            canon_len: 0,
            answer_curve_min_ops: 0,
        }
    }

    /// iGSM scores only its solution, which ends before the padded context: the run's MI width
    /// is measured over the lags that have scored pairs (before, the lag range reached past them
    /// and iGSM runs had no width), and it is shorter than the longest problem.
    #[test]
    fn igsm_runs_have_an_mi_width() {
        let mut cfg = tiny();
        cfg.task = TaskConfig::Igsm(tasks::igsm::IgsmParams {
            ops: 2,
            distractors: 0,
            ..Default::default()
        });
        cfg.vocab_size = 72;
        cfg.seq_len = 144;
        let w = cfg.data_width_mi().expect("an iGSM run has an MI width");
        // ops 2 without distractors: no text is longer than 79 characters.
        let longest = tasks::igsm::IgsmConfig {
            ops: 2,
            distractors: 0,
            ..Default::default()
        }
        .min_seq_len();
        assert!((1..longest).contains(&w), "w = {w}, longest text {longest}");
    }

    /// iGSM scores its whole solution (train and eval), the answer included; the needle scores
    /// its value digits; both check the vocabulary.
    #[test]
    fn igsm_scores_the_solution_and_needle_the_value() {
        let mut cfg = tiny();
        cfg.task = TaskConfig::Igsm(tasks::igsm::IgsmParams {
            ops: 3,
            ..Default::default()
        });
        cfg.vocab_size = 72;
        cfg.seq_len = 160;
        cfg.validate().unwrap();
        let train = cfg.task().batch(0, Split::Train, 0, 4).unwrap();
        let eval = cfg.task().batch(0, Split::Eval, 0, 4).unwrap();
        for ex in train.iter().chain(&eval) {
            let r = tasks::igsm::answer_positions(ex).unwrap();
            assert!(ex.mask.iter().filter(|&&m| m).count() > r.len() + 10);
        }
        cfg.vocab_size = 40;
        assert_eq!(
            cfg.validate().unwrap_err().to_string(),
            "vocab_size = 40 is out of range: must be ≥ 72 (the igsm task's character vocabulary)"
        );
        let mut cfg = tiny();
        cfg.task = TaskConfig::Needle(tasks::needle::NeedleParams {
            value_len: 3,
            needle_depth: 0.5,
            ..Default::default()
        });
        cfg.vocab_size = 66;
        cfg.seq_len = 40;
        cfg.validate().unwrap();
        let ex = &cfg.task().batch(0, Split::Eval, 0, 1).unwrap()[0];
        assert_eq!(ex.mask.iter().filter(|&&m| m).count(), 3);
        assert_eq!(cfg.dep_width(), 40);
    }

    #[test]
    fn fields_list_matches_struct() {
        let v = serde_json::to_value(tiny()).unwrap();
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        // the stopping options, nope_every, answer_curve and canon_len at their defaults: not
        // serialised
        keys.extend([
            "stop",
            "min_steps",
            "stop_window",
            "stop_tol",
            "nope_every",
            "answer_curve",
            "canon_len",
            "answer_curve_min_ops",
        ]);
        let mut sorted = RUN_FIELDS.to_vec();
        sorted.sort();
        let mut keys_sorted = keys.clone();
        keys_sorted.sort();
        assert_eq!(keys_sorted, sorted);
    }

    /// A sweep's flat keys become the run's task section; a serialised config reads back; the
    /// canonical JSON holds only the run's own task parameters.
    #[test]
    fn flat_tables_nest_into_the_task_section() {
        let mut t = toml::Table::try_from(tiny().flat()).unwrap();
        assert_eq!(t["task"].as_str(), Some("block"));
        assert_eq!(from_toml(t.clone()).unwrap(), tiny());
        let nested = toml::Table::try_from(tiny()).unwrap();
        assert_eq!(from_toml(nested).unwrap(), tiny());
        let json = tiny().canonical_json();
        assert!(json.starts_with(
            r#"{"task":{"kind":"block","variant":"copy","block_len":4,"noise":0.0},"vocab_size":16"#
        ), "{json}");
        assert!(!json.contains("max_letters") && !json.contains("corpus"));
        t.insert("ops".into(), toml::Value::Integer(3));
        assert!(
            from_toml(t)
                .unwrap_err()
                .starts_with("ops: a parameter of task igsm")
        );
    }

    /// An encoding's parameters nest into its section, only its own are serialised, and a
    /// parameter of another encoding is refused by name; each parameter type's `NAMES` lists
    /// what it serialises.
    #[test]
    fn flat_tables_nest_into_the_encoding_section() {
        use crate::model::{PRopeParams, TapaParams, TapaPhase};
        let mut t = toml::Table::try_from(tiny().flat()).unwrap();
        assert_eq!(t["encoding"].as_str(), Some("rope"));
        t.insert("encoding".into(), "tapa".into());
        t.insert("tapa_alpha".into(), toml::Value::Float(0.2));
        let c = from_toml(t.clone()).unwrap();
        assert_eq!(
            c.encoding,
            EncodingConfig::Tapa(TapaParams {
                tapa_rho: 0.5,
                tapa_alpha: 0.2,
                tapa_phase: TapaPhase::Quadratic,
                tapa_phase_init_scale: 1.0,
                tapa_phase_gain: 1.0,
            })
        );
        assert!(c.canonical_json().contains(
            r#""encoding":{"kind":"tapa","tapa_rho":0.5,"tapa_alpha":0.2,"tapa_phase":"quadratic"}"#
        ));
        let flat = c.flat();
        assert_eq!(flat["encoding"], "tapa");
        assert_eq!(flat["tapa_alpha"], 0.2);
        assert!(!tiny().flat().contains_key("tapa_alpha") && !tiny().flat().contains_key("rope_p"));
        // `--set` over a stored (nested) config: the flat key wins.
        let mut stored = toml::Table::try_from(&c).unwrap();
        stored.insert("tapa_alpha".into(), toml::Value::Float(0.3));
        let again = from_toml(stored).unwrap();
        assert_eq!(
            again.encoding,
            EncodingConfig::Tapa(TapaParams {
                tapa_alpha: 0.3,
                ..TapaParams::default()
            })
        );
        t.insert("rope_p".into(), toml::Value::Float(0.5));
        assert_eq!(
            from_toml(t).unwrap_err(),
            "rope_p: a parameter of encoding p-rope, not of this run's encoding tapa; remove it, \
             or set it only for runs with encoding = \"p-rope\" (in their [[arms]])"
        );
        let mut t = toml::Table::try_from(tiny().flat()).unwrap();
        t.insert("encoding".into(), "ropee".into());
        let e = from_toml(t).unwrap_err();
        assert!(
            e.starts_with("encoding: unknown encoding `ropee`")
                && e.contains("did you mean `rope`"),
            "{e}"
        );
        // answer_curve_min_ops: iGSM only, with an answer curve, in 2..=ops.
        let igsm = |ops| {
            TaskConfig::Igsm(tasks::igsm::IgsmParams {
                ops,
                distractors: 0,
                ..Default::default()
            })
        };
        let mut c = tiny();
        c.answer_curve_min_ops = 2;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "answer_curve_min_ops = 2 is out of range: must be 0: answers are decoded for task igsm only"
        );
        c.task = igsm(3);
        c.vocab_size = 72;
        c.seq_len = 144;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "answer_curve_min_ops = 2 is out of range: must be 0 when answer_curve is 0 (no answer curve is decoded)"
        );
        c.answer_curve = 4;
        c.validate().unwrap();
        c.answer_curve_min_ops = 4;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "answer_curve_min_ops = 4 is out of range: must be in 2..=3"
        );
        c.answer_curve_min_ops = 1;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "answer_curve_min_ops = 1 is out of range: must be in 2..=3"
        );
        c.task = igsm(1);
        c.answer_curve_min_ops = 2;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "answer_curve_min_ops = 2 is out of range: must be 0 when ops < 2 (no smaller size has held-out problems)"
        );
        // Ranges of an encoding's own parameters.
        let mut c = tiny();
        c.encoding = EncodingConfig::PRope(PRopeParams { rope_p: 0.01 });
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "rope_p = 0.01 is out of range: must be in [1/4, 1] (keep at least one of the 4 rotary pairs)"
        );
        c.encoding = EncodingConfig::Tapa(TapaParams {
            tapa_rho: 1.0,
            ..TapaParams::default()
        });
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "tapa_rho = 1 is out of range: must be in (0, 1)"
        );
        for e in Encoding::ALL {
            let mut cfg = EncodingConfig::from(*e);
            assert_eq!(cfg.kind(), *e);
            // Keys left out at their default (so that run ids stay as they were) are listed
            // when set: TAPA's phase scale and gain.
            if let EncodingConfig::Tapa(p) = &mut cfg {
                p.tapa_phase_init_scale = 2.0;
                p.tapa_phase_gain = 2.0;
            }
            let mut keys: Vec<String> = cfg.flat().keys().cloned().collect();
            keys.retain(|k| k != "encoding");
            let mut names: Vec<String> = e.params().iter().map(|s| s.to_string()).collect();
            keys.sort();
            names.sort();
            assert_eq!(keys, names, "{}", e.name());
        }
    }

    /// A schema-1 `config.json` (flat task parameters) or a schema-2 one (flat encoding
    /// parameters) gets one line saying what to do.
    #[test]
    fn schema_1_configs_are_named() {
        let mut old = tiny().flat();
        old.insert("ops".into(), 4.into());
        let e = RunConfig::from_json(&serde_json::Value::Object(old).to_string()).unwrap_err();
        assert!(e.starts_with("a run config of schema 1"), "{e}");
        let two = tiny()
            .canonical_json()
            .replace(r#""encoding":{"kind":"rope"}"#, r#""encoding":"rope""#);
        assert_ne!(two, tiny().canonical_json());
        let e = RunConfig::from_json(&two).unwrap_err();
        assert!(e.starts_with("a run config of schema 2"), "{e}");
        assert_eq!(
            RunConfig::from_json(&tiny().canonical_json()).unwrap(),
            tiny()
        );
        let bad = tiny()
            .canonical_json()
            .replace(r#""steps":4"#, r#""steps":"four""#);
        assert_eq!(
            RunConfig::from_json(&bad).unwrap_err(),
            "steps: invalid type: string \"four\", expected usize"
        );
    }

    #[test]
    fn training_indices_wrap_over_a_fixed_set() {
        let mut c = tiny();
        c.batch_size = 4;
        c.train_examples = 6;
        let task = c.task();
        let all = task.batch(c.seed, Split::Train, 0, 6).unwrap();
        // step 1 covers indices 4, 5, 0, 1.
        let b = c.train_batch(1).unwrap();
        assert_eq!(
            b,
            vec![
                all[4].clone(),
                all[5].clone(),
                all[0].clone(),
                all[1].clone()
            ]
        );
        c.train_examples = 0;
        assert_eq!(
            c.train_batch(1).unwrap(),
            task.batch(c.seed, Split::Train, 4, 4).unwrap()
        );
    }

    #[test]
    fn run_id_is_stable_and_sensitive() {
        let a = tiny();
        assert_eq!(a.run_id(), tiny().run_id());
        assert_eq!(a.run_id().len(), 16);
        let mut b = tiny();
        b.seed = 1;
        assert_ne!(a.run_id(), b.run_id());
        // The stopping fields at their defaults are not serialised (ids of older runs hold);
        // a spectrum stop is part of the identity.
        assert!(!a.canonical_json().contains("stop"));
        let mut c = tiny();
        c.stop = StopRule::Spectrum;
        assert!(c.canonical_json().contains(r#""stop":"spectrum""#));
        assert_ne!(a.run_id(), c.run_id());
        c.validate().unwrap();
        c.min_steps = c.steps + 1;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "min_steps = 5 is out of range: must be in 0..=4"
        );
    }

    #[test]
    fn errors_name_the_field_and_range() {
        let mut c = tiny();
        c.n_heads = 3;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "n_heads = 3 is out of range: must divide d_model = 16"
        );
        let mut c = tiny();
        c.lr = -1.0;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "lr = -1 is out of range: must be in (0, 10]"
        );
        let mut c = tiny();
        c.stop_tol = f64::NAN;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "stop_tol = NaN is out of range: must be in (0, 10]"
        );
        let mut c = tiny();
        c.task = TaskConfig::Block(tasks::block::BlockParams {
            variant: tasks::block::BlockVariant::Copy,
            block_len: 99,
            noise: 0.0,
        });
        let msg = c.validate().unwrap_err().to_string();
        assert!(msg.contains("block_len"), "{msg}");
        assert!(!msg.contains('\n'));
    }
}

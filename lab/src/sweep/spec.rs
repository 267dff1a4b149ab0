//! Sweep files (`sweeps/<name>.toml`): a base config, a grid, arms and presets.
//!
//! ```toml
//! description = "what the sweep measures"
//! claim = "the claim it tests, with the paper's number"   # shown by `lab report`
//! default_preset = "quick"
//!
//! [base]              # every RunConfig field (see `lab::config::RunConfig`)
//! task = "block"
//! block_len = 8
//! # ...
//!
//! [grid]              # common axes: field = [values]; the runs are their cartesian product
//! block_len = [4, 8, 16]
//!
//! [[arms]]            # optional: each arm adds its own axes; runs = grid × (arm₁ ∪ arm₂ ∪ …)
//! encoding = ["rope"]
//! seed = [0, 1, 2]
//!
//! [[evals]]           # optional: after training, evaluate each run at other lengths
//! name = "dilated"    # (RoPE scalings apply to RoPE runs; other encodings run `none` only)
//! length_factors = [2, 4]          # s: evaluate at s·seq_len
//! scalings = ["none", "linear", "ntk", "yarn"]   # with factor s
//! scale_params = ["block_len"]     # task fields multiplied by s too (self-similar task)
//! set = { noise = 0.0 }            # fixed task overrides
//! tasks = ["block"]                # only runs of these tasks (default: all)
//! ablate = ["law", "far"]          # RoPE runs: also evaluate with a band of pairs at θ = 0
//!
//! [presets.smoke]     # a preset overrides base fields, replaces named grid axes, and may
//! base = { steps = 20 }   # replace the arms and the evals
//! jobs = 2            # runs at once when `lab sweep` is given no --jobs (default 1)
//! grid = { block_len = [4, 16] }
//! arms = [{ encoding = ["rope"], seed = [0] }]
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::analysis::select::Selection;
use crate::config::RunConfig;
pub use crate::hint::{did_you_mean, hint_unknown};
use crate::model::scaling::ScalingKind;

/// One `[[evals]]` entry: evaluations of every trained run at other context lengths.
#[derive(Clone, Debug, PartialEq, serde::Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalSpec {
    /// Name recorded in the `evals` table (`eval_name`).
    pub name: String,
    /// Length factors `s ≥ 1`: evaluate at `s · seq_len` tokens.
    pub length_factors: Vec<usize>,
    /// RoPE scalings to evaluate with (factor `s`, original length = training `seq_len`); runs
    /// of other encodings are evaluated as trained, once per length.
    #[serde(default = "default_scalings")]
    pub scalings: Vec<ScalingKind>,
    /// Integer task fields multiplied by `s` as well (e.g. `block_len` for a self-similar task).
    #[serde(default)]
    pub scale_params: Vec<String>,
    /// Fixed task overrides for the evaluation (`field = value`).
    #[serde(default)]
    pub set: toml::Table,
    /// Only runs of these tasks are evaluated (empty: all).
    #[serde(default)]
    pub tasks: Vec<crate::config::TaskKind>,
    /// The causal check (SCIENCE.md §8): for RoPE runs, at each length factor, one more
    /// evaluation per band with that band's rotary pairs at `θ = 0` (`law`: around π/W; `far`:
    /// an equally wide band far from it; docs/analysis-rules.md R5). The unablated evaluation
    /// of the same entry is the baseline.
    #[serde(default)]
    pub ablate: Vec<crate::analysis::bands::Band>,
}

fn default_scalings() -> Vec<ScalingKind> {
    vec![ScalingKind::None]
}

/// Check a run's `[[evals]]` before anything trains (issue 16): every evaluated length within
/// a run's `seq_len` bound, `set` and `scale_params` naming fields an evaluation may change
/// ([`crate::eval::EVAL_SETTABLE`]).
fn check_evals(cfg: &RunConfig, evals: &[EvalSpec]) -> Result<(), String> {
    let max = tasks::MAX_SEQ_LEN;
    for e in evals {
        if !e.tasks.is_empty() && !e.tasks.contains(&cfg.task.kind()) {
            continue; // not evaluated
        }
        for &s in &e.length_factors {
            let len = cfg.seq_len.saturating_mul(s);
            if s == 0 || len > max {
                return Err(format!(
                    "[[evals]] `{}`: length factor {s} gives seq_len = {len} for this run; must be in 1..={} (seq_len·s ≤ {max})",
                    e.name,
                    max / cfg.seq_len.max(1)
                ));
            }
        }
        let keys = e
            .set
            .keys()
            .map(String::as_str)
            .chain(e.scale_params.iter().map(String::as_str));
        for k in keys {
            if !crate::eval::EVAL_SETTABLE.contains(&k) {
                return Err(format!(
                    "[[evals]] `{}`: `{k}` cannot change at evaluation; set and scale_params take: {}",
                    e.name,
                    crate::eval::EVAL_SETTABLE.join(", ")
                ));
            }
            let kind = cfg.task.kind();
            if let Some(owner) = crate::config::TaskKind::ALL
                .iter()
                .find(|t| t.params().contains(&k))
                .filter(|_| !kind.params().contains(&k))
            {
                return Err(format!(
                    "[[evals]] `{}`: `{k}` is a parameter of task {owner}, not of this run's task {kind}; restrict the entry with tasks = [\"{owner}\"]",
                    e.name
                ));
            }
        }
    }
    Ok(())
}

/// Errors in a sweep file or its expansion. One line each.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The sweep name is unknown.
    #[error("unknown sweep `{name}`; available sweeps: {available}")]
    UnknownSweep {
        /// What was asked.
        name: String,
        /// Comma-separated list.
        available: String,
    },
    /// A path given as the sweep that is not a sweep file.
    #[error("{path}: not a sweep file: {why}")]
    NotASweepFile {
        /// The path as given.
        path: PathBuf,
        /// Why (missing, a folder, not a .toml).
        why: String,
    },
    /// The file cannot be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// TOML syntax or structure error.
    #[error("{path}:{line}:{column}: {message}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// A key that is not a config field.
    #[error("{path}: unknown key `{key}` in {section}{hint}")]
    UnknownKey {
        /// The file.
        path: PathBuf,
        /// Where (`[base]`, `[grid]`, …).
        section: String,
        /// The key.
        key: String,
        /// `; did you mean `x`?` or empty.
        hint: String,
    },
    /// The preset does not exist.
    #[error("--preset {preset}: {path} has no preset `{preset}`; available presets: {available}")]
    UnknownPreset {
        /// The file.
        path: PathBuf,
        /// What was asked.
        preset: String,
        /// Comma-separated list.
        available: String,
    },
    /// A run's config is invalid.
    #[error("{path}: {context}: {message}")]
    InvalidRun {
        /// The file.
        path: PathBuf,
        /// Which run (`preset quick, block_len = 2, …`).
        context: String,
        /// The field error.
        message: String,
    },
    /// A `--set` override that would change nothing in the plan (another setting of higher
    /// precedence fixes the key, or it targets a preset that is not run).
    #[error("--set {set} has no effect: {reason}")]
    NoEffect {
        /// The override as given (`KEY=VALUE`).
        set: String,
        /// Why, and what would set the key instead.
        reason: String,
    },
    /// A `--set` override that cannot apply.
    #[error("--set {set}: {message}")]
    BadOverride {
        /// The override as given (`KEY=VALUE`).
        set: String,
        /// What is wrong, and what is allowed.
        message: String,
    },
    /// The grid expands to no run.
    #[error("{path}: preset `{preset}` has an empty grid (an axis with no values)")]
    EmptyGrid {
        /// The file.
        path: PathBuf,
        /// The preset.
        preset: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SweepFile {
    #[serde(default)]
    description: String,
    #[serde(default)]
    claim: String,
    #[serde(default)]
    default_preset: Option<String>,
    base: toml::Table,
    #[serde(default)]
    grid: BTreeMap<String, Vec<toml::Value>>,
    #[serde(default)]
    arms: Vec<BTreeMap<String, Vec<toml::Value>>>,
    #[serde(default)]
    presets: BTreeMap<String, Preset>,
    #[serde(default)]
    evals: Vec<EvalSpec>,
    /// `[select]`: the selection on validation every preset uses unless it has its own.
    #[serde(default)]
    select: Option<Selection>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Preset {
    #[serde(default)]
    description: String,
    #[serde(default)]
    base: toml::Table,
    #[serde(default)]
    grid: BTreeMap<String, Vec<toml::Value>>,
    #[serde(default)]
    arms: Option<Vec<BTreeMap<String, Vec<toml::Value>>>>,
    #[serde(default)]
    evals: Option<Vec<EvalSpec>>,
    /// `[presets.P.select]`: this preset's selection on validation (replaces the file's).
    #[serde(default)]
    select: Option<Selection>,
    /// Runs at once when `lab sweep` is not given `--jobs` (default 1).
    #[serde(default)]
    jobs: Option<usize>,
}

/// A parsed sweep file.
#[derive(Debug)]
pub struct SweepSpec {
    /// Sweep name (file stem).
    pub name: String,
    /// File it came from.
    pub path: PathBuf,
    /// One-line description.
    pub description: String,
    /// The claim the sweep tests, with the paper's number (`claim = "…"`; `lab report`).
    pub claim: String,
    /// Preset used when none is given.
    pub default_preset: String,
    file: SweepFile,
    /// Command-line overrides of config fields (`--set field=value`), applied last
    /// ([`SweepSpec::set`]).
    overrides: Vec<(String, toml::Value)>,
    /// Every `--set` as given, in order (for provenance and the Slurm script).
    sets: Vec<String>,
    /// What each of `sets` changed, in the same order ([`SweepSpec::check_sets_take_effect`]).
    targets: Vec<SetTarget>,
}

/// What one `--set KEY=VALUE` changed.
#[derive(Clone, Debug, PartialEq)]
enum SetTarget {
    /// `FIELD=V`: every run's field (applied last).
    Field(String),
    /// `base.FIELD=V`: the file's base.
    Base(String),
    /// `grid.FIELD=[…]`: the file's grid.
    Grid(String),
    /// `presets.P.base.FIELD=V`.
    PresetBase(String, String),
    /// `presets.P.grid.FIELD=[…]`.
    PresetGrid(String, String),
    /// `presets.P.jobs=N`.
    PresetJobs(String),
}

/// One expanded run: its config and the grid values that made it.
#[derive(Clone, Debug)]
pub struct PlannedRun {
    /// Fully resolved config.
    pub config: RunConfig,
    /// `(axis, value)` pairs from the grid and arm, in axis order.
    pub axes: Vec<(String, String)>,
    /// Evaluations to run after training (the preset's `[[evals]]`).
    pub evals: Vec<EvalSpec>,
}

impl PlannedRun {
    /// The run's grid values as `axis=value` words, e.g. `block_len=4 seed=0`.
    pub fn label(&self) -> String {
        self.axes
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

fn syntax_error(path: &Path, text: &str, e: &toml::de::Error) -> SpecError {
    let (line, column) = e
        .span()
        .map(|s| {
            let before = &text[..s.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
            (line, column)
        })
        .unwrap_or((1, 1));
    SpecError::Syntax {
        path: path.to_path_buf(),
        line,
        column,
        message: hint_unknown(e.message()),
    }
}

impl SweepSpec {
    /// Parse a sweep file.
    pub fn load(path: &Path) -> Result<Self, SpecError> {
        let text = std::fs::read_to_string(path).map_err(|source| SpecError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Parse sweep text (`path` is used for names and messages).
    pub fn parse(path: &Path, text: &str) -> Result<Self, SpecError> {
        let file: SweepFile = toml::from_str(text).map_err(|e| syntax_error(path, text, &e))?;
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let fields = crate::config::fields();
        let check = |section: &str, keys: Vec<&String>| -> Result<(), SpecError> {
            for k in keys {
                if !fields.contains(&k.as_str()) {
                    return Err(SpecError::UnknownKey {
                        path: path.to_path_buf(),
                        section: section.to_string(),
                        key: k.clone(),
                        hint: did_you_mean(k, fields.iter().copied()),
                    });
                }
            }
            Ok(())
        };
        check("[base]", file.base.keys().collect())?;
        check("[grid]", file.grid.keys().collect())?;
        for arm in &file.arms {
            check("[[arms]]", arm.keys().collect())?;
        }
        let check_evals = |section: &str, evals: &[EvalSpec]| -> Result<(), SpecError> {
            for e in evals {
                check(section, e.scale_params.iter().collect())?;
                check(section, e.set.keys().collect())?;
                if e.length_factors.is_empty() || e.length_factors.contains(&0) {
                    return Err(SpecError::InvalidRun {
                        path: path.to_path_buf(),
                        context: format!("{section} `{}`", e.name),
                        message: "length_factors must be a non-empty list of integers ≥ 1"
                            .to_string(),
                    });
                }
            }
            Ok(())
        };
        check_evals("[[evals]]", &file.evals)?;
        for (pname, p) in &file.presets {
            let sec = format!("[presets.{pname}]");
            check(&sec, p.base.keys().collect())?;
            check(&sec, p.grid.keys().collect())?;
            for arm in p.arms.iter().flatten() {
                check(&sec, arm.keys().collect())?;
            }
            check_evals(&sec, p.evals.as_deref().unwrap_or_default())?;
            if let Some(j) = p.jobs
                && !(1..=256).contains(&j)
            {
                return Err(SpecError::InvalidRun {
                    path: path.to_path_buf(),
                    context: sec.clone(),
                    message: format!("jobs = {j} is out of range: must be in 1..=256"),
                });
            }
        }
        let default_preset = file
            .default_preset
            .clone()
            .or_else(|| {
                file.presets
                    .contains_key("quick")
                    .then(|| "quick".to_string())
            })
            .or_else(|| file.presets.keys().next().cloned())
            .unwrap_or_else(|| "default".to_string());
        if file.default_preset.is_some() && !file.presets.contains_key(&default_preset) {
            return Err(SpecError::InvalidRun {
                path: path.to_path_buf(),
                context: "default_preset".to_string(),
                message: format!(
                    "`{default_preset}` is not one of the file's [presets.*]: {}",
                    file.presets.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            });
        }
        Ok(Self {
            name,
            path: path.to_path_buf(),
            description: file.description.clone(),
            claim: file.claim.clone(),
            default_preset,
            file,
            overrides: Vec::new(),
            sets: Vec::new(),
            targets: Vec::new(),
        })
    }

    /// Apply command-line overrides (`lab sweep NAME --set KEY=VALUE`, repeatable), in order.
    ///
    /// `KEY` is either
    /// - a config field (`steps`, `block_len`, `encoding`, an encoding's or task's parameter):
    ///   it applies to every run of the chosen preset, after the file's base, grid, preset and
    ///   arms: a list value (`block_len=[4,16]`) makes the field an axis with those values, a
    ///   scalar (`steps=1000`) fixes it; either way the file's axis or value of that field, in
    ///   the grid and in every arm, is replaced (arms that become identical are one run);
    /// - or a dotted path into the file: `base.F`, `grid.F` (a list), `presets.P.base.F`,
    ///   `presets.P.grid.F` (a list), `presets.P.jobs`: as if the file said so.
    ///
    /// `VALUE` is TOML (`1e-3`, `[4, 16]`, `"rope"`, `true`); a bare word that is not TOML is
    /// a string (`encoding=rope`). Run ids follow the resolved configs, so an overridden run is a
    /// new run and never one trained with other settings.
    ///
    /// # Errors
    /// One line naming the override: no `=`, an unknown field (with a suggestion), an unknown
    /// preset or section, a grid value that is not a list, `jobs` out of 1..=256. Invalid values
    /// are reported by [`SweepSpec::expand`] as for the file.
    pub fn set(&mut self, sets: &[String]) -> Result<(), SpecError> {
        let fields = crate::config::fields();
        for set in sets {
            let bad = |message: String| SpecError::BadOverride {
                set: set.clone(),
                message,
            };
            let Some((key, raw)) = set.split_once('=') else {
                return Err(bad(
                    "expected KEY=VALUE, e.g. --set steps=1000 or --set block_len=[4,16]".into(),
                ));
            };
            let (key, raw) = (key.trim(), raw.trim());
            if key.is_empty() || raw.is_empty() {
                return Err(bad(
                    "expected KEY=VALUE with both sides non-empty, e.g. --set steps=1000".into(),
                ));
            }
            let value = parse_override_value(raw);
            let field = |name: &str| -> Result<String, SpecError> {
                if fields.contains(&name) {
                    Ok(name.to_string())
                } else {
                    Err(bad(format!(
                        "unknown config field `{name}`{}",
                        did_you_mean(name, fields.iter().copied())
                    )))
                }
            };
            let list = |v: &toml::Value| -> Result<Vec<toml::Value>, SpecError> {
                match v {
                    toml::Value::Array(a) if !a.is_empty() => Ok(a.clone()),
                    _ => Err(bad(
                        "a grid axis takes a non-empty list, e.g. [4, 16]".into()
                    )),
                }
            };
            let parts: Vec<&str> = key.split('.').collect();
            match parts.as_slice() {
                [name] => {
                    let name = field(name)?;
                    if let toml::Value::Array(a) = &value
                        && a.is_empty()
                    {
                        return Err(bad("an axis needs at least one value".into()));
                    }
                    self.overrides.retain(|(k, _)| *k != name);
                    self.overrides.push((name.clone(), value));
                    self.targets.push(SetTarget::Field(name));
                }
                ["base", name] => {
                    let name = field(name)?;
                    self.file.base.insert(name.clone(), value);
                    self.targets.push(SetTarget::Base(name));
                }
                ["grid", name] => {
                    let name = field(name)?;
                    let values = list(&value)?;
                    self.file.grid.insert(name.clone(), values);
                    self.targets.push(SetTarget::Grid(name));
                }
                ["presets", preset, rest @ ..] => {
                    let available = self
                        .file
                        .presets
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ");
                    let Some(p) = self.file.presets.get_mut(*preset) else {
                        return Err(bad(format!(
                            "unknown preset `{preset}`; available presets: {available}"
                        )));
                    };
                    let preset = preset.to_string();
                    match rest {
                        ["base", name] => {
                            let name = field(name)?;
                            p.base.insert(name.clone(), value);
                            self.targets.push(SetTarget::PresetBase(preset, name));
                        }
                        ["grid", name] => {
                            let name = field(name)?;
                            let values = list(&value)?;
                            p.grid.insert(name.clone(), values);
                            self.targets.push(SetTarget::PresetGrid(preset, name));
                        }
                        ["jobs"] => match value.as_integer() {
                            Some(j) if (1..=256).contains(&j) => {
                                p.jobs = Some(j as usize);
                                self.targets.push(SetTarget::PresetJobs(preset));
                            }
                            _ => return Err(bad("jobs must be an integer in 1..=256".into())),
                        },
                        _ => {
                            return Err(bad(format!(
                                "a preset's settable keys are presets.{preset}.base.FIELD, presets.{preset}.grid.FIELD and presets.{preset}.jobs"
                            )));
                        }
                    }
                }
                _ => {
                    return Err(bad(
                        "KEY is a config field (steps=1000, block_len=[4,16]) or base.FIELD, grid.FIELD, presets.NAME.base.FIELD, presets.NAME.grid.FIELD, presets.NAME.jobs".into(),
                    ));
                }
            }
            self.sets.push(set.clone());
        }
        Ok(())
    }

    /// Refuse every `--set` that leaves the plan of `preset` unchanged (issue 51, item 3): one
    /// aimed at another preset; a `base.F` or `grid.F` that the preset's own base or grid, a
    /// grid axis, every arm, or a later plain `--set F=…` replaces; a `presets.P.jobs` that
    /// `--jobs` (`jobs_given`) replaces; a plain `--set F` given again later. Such an override
    /// would be listed in the sweep's header and provenance as if it had been applied.
    ///
    /// # Errors
    /// [`SpecError::NoEffect`] for the first such override, saying what replaces it and what
    /// would set the key instead.
    pub fn check_sets_take_effect(&self, preset: &str, jobs_given: bool) -> Result<(), SpecError> {
        let p = self.file.presets.get(preset);
        let arms: &[BTreeMap<String, Vec<toml::Value>>] = match p.and_then(|p| p.arms.as_deref()) {
            Some(a) => a,
            None => &self.file.arms,
        };
        let every_arm = |f: &str| !arms.is_empty() && arms.iter().all(|a| a.contains_key(f));
        let in_preset_base = |f: &str| p.is_some_and(|p| p.base.contains_key(f));
        let in_preset_grid = |f: &str| p.is_some_and(|p| p.grid.contains_key(f));
        for (i, (set, target)) in self.sets.iter().zip(&self.targets).enumerate() {
            let later_field = |f: &str| {
                self.targets[i + 1..]
                    .iter()
                    .any(|t| *t == SetTarget::Field(f.to_string()))
            };
            let value = set.split_once('=').map(|(_, v)| v.trim()).unwrap_or("");
            let reason: Option<String> = match target {
                SetTarget::Field(f) if later_field(f) => {
                    Some(format!("a later --set {f}=… replaces it"))
                }
                SetTarget::Field(_) => None,
                SetTarget::PresetBase(q, _)
                | SetTarget::PresetGrid(q, _)
                | SetTarget::PresetJobs(q)
                    if q != preset =>
                {
                    Some(format!(
                        "it changes preset {q}, but this sweep runs preset {preset}; add --preset {q}, or set the key for preset {preset}"
                    ))
                }
                SetTarget::PresetJobs(_) if jobs_given => {
                    Some("--jobs replaces it; leave one of the two out".to_string())
                }
                SetTarget::PresetJobs(_) => None,
                SetTarget::Base(f)
                | SetTarget::Grid(f)
                | SetTarget::PresetBase(_, f)
                | SetTarget::PresetGrid(_, f)
                    if later_field(f) =>
                {
                    Some(format!("a later --set {f}=… replaces it"))
                }
                SetTarget::Base(f) if in_preset_base(f) => Some(format!(
                    "preset {preset} sets {f} itself (presets.{preset}.base.{f}), which overrides base.{f}; use --set {f}={value} (every run) or --set presets.{preset}.base.{f}={value}"
                )),
                SetTarget::Base(f) | SetTarget::PresetBase(_, f)
                    if self.file.grid.contains_key(f) || in_preset_grid(f) =>
                {
                    let at = if in_preset_grid(f) {
                        format!("presets.{preset}.grid.{f}")
                    } else {
                        format!("grid.{f}")
                    };
                    Some(format!(
                        "{f} is a grid axis of preset {preset} ({at}), which overrides a base value; use --set {f}={value} to fix it for every run"
                    ))
                }
                SetTarget::Grid(f) if in_preset_grid(f) => Some(format!(
                    "preset {preset} has its own axis {f} (presets.{preset}.grid.{f}), which replaces grid.{f}; use --set {f}={value} or --set presets.{preset}.grid.{f}={value}"
                )),
                SetTarget::Base(f)
                | SetTarget::Grid(f)
                | SetTarget::PresetBase(_, f)
                | SetTarget::PresetGrid(_, f)
                    if every_arm(f) =>
                {
                    Some(format!(
                        "every [[arms]] entry of preset {preset} sets {f}, which overrides it; use --set {f}={value} to fix it for every run"
                    ))
                }
                _ => None,
            };
            if let Some(reason) = reason {
                return Err(SpecError::NoEffect {
                    set: set.clone(),
                    reason,
                });
            }
        }
        Ok(())
    }

    /// Every `--set KEY=VALUE` applied, as given, in order.
    pub fn sets(&self) -> &[String] {
        &self.sets
    }

    /// The command-line overrides of config fields in force (`--set field=value`), in order.
    pub fn overrides(&self) -> &[(String, toml::Value)] {
        &self.overrides
    }

    /// Preset names with their descriptions.
    pub fn presets(&self) -> Vec<(String, String)> {
        self.file
            .presets
            .iter()
            .map(|(k, p)| (k.clone(), p.description.clone()))
            .collect()
    }

    /// Runs at once that `preset` asks for when the command line gives no `--jobs` (its `jobs`
    /// key), or `None`.
    pub fn preset_jobs(&self, preset: &str) -> Option<usize> {
        self.file.presets.get(preset).and_then(|p| p.jobs)
    }

    /// The selection on validation of `preset` (docs/analysis-rules.md R58): its own
    /// `[presets.P.select]`, else the file's `[select]`; `None` when neither says one.
    ///
    /// # Errors
    /// [`SpecError::InvalidRun`] naming the `select` table: an empty `over`, or an axis of it
    /// that is not a config field or does not take at least two values in `plan` (`--set`
    /// included), so that the selection would have nothing to choose.
    pub fn selection(
        &self,
        preset: &str,
        plan: &[PlannedRun],
    ) -> Result<Option<Selection>, SpecError> {
        let (sel, context) = match self.file.presets.get(preset).and_then(|p| p.select.clone()) {
            Some(s) => (s, format!("[presets.{preset}.select]")),
            None => match self.file.select.clone() {
                Some(s) => (s, "[select]".to_string()),
                None => return Ok(None),
            },
        };
        let bad = |message: String| SpecError::InvalidRun {
            path: self.path.clone(),
            context: context.clone(),
            message,
        };
        if sel.over.is_empty() {
            return Err(bad(
                "over = [] chooses nothing: name the axes chosen on, e.g. over = [\"lr\"]".into(),
            ));
        }
        let fields = crate::config::fields();
        for axis in &sel.over {
            if !fields.contains(&axis.as_str()) {
                return Err(bad(format!(
                    "over: `{axis}` is not a config field{}",
                    did_you_mean(axis, fields.iter().copied())
                )));
            }
            let mut values: Vec<&str> = plan
                .iter()
                .flat_map(|r| r.axes.iter())
                .filter(|(k, _)| k == axis)
                .map(|(_, v)| v.as_str())
                .collect();
            values.sort_unstable();
            values.dedup();
            if values.len() < 2 {
                return Err(bad(format!(
                    "over: `{axis}` takes {} value(s) in preset {preset}{}; a selection needs an axis with at least 2 (e.g. grid {axis} = [a, b, c], or --set '{axis}=[a,b,c]')",
                    values.len(),
                    if values.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", values.join(", "))
                    }
                )));
            }
        }
        Ok(Some(sel))
    }

    /// Expand `preset` into runs, each validated.
    pub fn expand(&self, preset: &str) -> Result<Vec<PlannedRun>, SpecError> {
        let p = match self.file.presets.get(preset) {
            Some(p) => Some(p),
            None if self.file.presets.is_empty() && preset == "default" => None,
            None => {
                return Err(SpecError::UnknownPreset {
                    path: self.path.clone(),
                    preset: preset.to_string(),
                    available: self
                        .file
                        .presets
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
        };
        let mut base = self.file.base.clone();
        let mut grid = self.file.grid.clone();
        let mut arms = self.file.arms.clone();
        let mut evals = self.file.evals.clone();
        if let Some(p) = p {
            if let Some(e) = &p.evals {
                evals = e.clone();
            }
            for (k, v) in &p.base {
                base.insert(k.clone(), v.clone());
            }
            for (k, v) in &p.grid {
                grid.insert(k.clone(), v.clone());
            }
            if let Some(a) = &p.arms {
                arms = a.clone();
            }
        }
        // Command-line overrides of a field replace the file's value and axis of that field,
        // in the base, the grid and every arm.
        for (k, v) in &self.overrides {
            base.remove(k);
            grid.remove(k);
            for arm in &mut arms {
                arm.remove(k);
            }
            match v {
                toml::Value::Array(values) => {
                    grid.insert(k.clone(), values.clone());
                }
                scalar => {
                    base.insert(k.clone(), scalar.clone());
                }
            }
        }
        if arms.is_empty() {
            arms.push(BTreeMap::new());
        }
        let mut runs = Vec::new();
        for arm in &arms {
            let mut axes: Vec<(String, Vec<toml::Value>)> =
                grid.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            for (k, v) in arm {
                axes.retain(|(a, _)| a != k);
                axes.push((k.clone(), v.clone()));
            }
            if axes.iter().any(|(_, v)| v.is_empty()) {
                return Err(SpecError::EmptyGrid {
                    path: self.path.clone(),
                    preset: preset.to_string(),
                });
            }
            for combo in cartesian(&axes) {
                let mut table = base.clone();
                let mut labels = Vec::new();
                for (k, v) in &combo {
                    table.insert(k.clone(), v.clone());
                    labels.push((k.clone(), value_label(v)));
                }
                let labels_text = if labels.is_empty() {
                    "base config".to_string()
                } else {
                    labels
                        .iter()
                        .map(|(k, v)| format!("{k} = {v}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let context = format!(
                    "preset {preset}{}, {labels_text}",
                    if self.overrides.is_empty() {
                        String::new()
                    } else {
                        format!(
                            " with --set {}",
                            self.overrides
                                .iter()
                                .map(|(k, v)| format!("{k}={v}"))
                                .collect::<Vec<_>>()
                                .join(" --set ")
                        )
                    },
                );
                // An error about a key typed with --set names that --set, not the file.
                let invalid = |message: String| match crate::hint::blamed(&message, &self.sets) {
                    Some(set) => SpecError::BadOverride {
                        set: set.clone(),
                        message: format!("{message} (preset {preset}, {labels_text})"),
                    },
                    None => SpecError::InvalidRun {
                        path: self.path.clone(),
                        context: context.clone(),
                        message,
                    },
                };
                let config: RunConfig = crate::config::from_toml(table).map_err(invalid)?;
                config.validate().map_err(|e| invalid(e.to_string()))?;
                check_evals(&config, &evals).map_err(invalid)?;
                runs.push(PlannedRun {
                    config,
                    axes: labels,
                    evals: evals.clone(),
                });
            }
        }
        if runs.is_empty() {
            return Err(SpecError::EmptyGrid {
                path: self.path.clone(),
                preset: preset.to_string(),
            });
        }
        // The same config reached through two arms is one run.
        let mut seen = std::collections::HashSet::new();
        runs.retain(|r| seen.insert(r.config.run_id()));
        // A selection with nothing to choose is refused wherever a plan is made.
        self.selection(preset, &runs)?;
        Ok(runs)
    }
}

/// A `--set` value: TOML (`1e-3`, `[4, 16]`, `"rope"`, `true`), else the text as a string
/// (`rope`, `p-rope`); a bracketed list that is not TOML is a list of such items (`[rope,pope]`
/// = `["rope", "pope"]`, `[rope, 4]` = `["rope", 4]`).
fn parse_override_value(raw: &str) -> toml::Value {
    if let Some(v) = toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
    {
        return v;
    }
    let trimmed = raw.trim();
    match trimmed.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        Some(inner) if !inner.contains(['[', ']']) => toml::Value::Array(
            inner
                .split(',')
                .map(str::trim)
                .filter(|item| !item.is_empty())
                .map(parse_override_value)
                .collect(),
        ),
        _ => toml::Value::String(raw.to_string()),
    }
}

/// The grid a plan resolved to: each axis with its values in order of first appearance, and
/// the number of runs, e.g. `block_len = [4, 16] × seed = [0, 1, 2] → 6 runs`. An axis that only
/// some arms vary lists the other runs' value too (an arm training NoPE for `steps = [300]`
/// beside a base of 1000 shows `steps = [1000, 300]`, not `[300]`).
pub fn describe_plan(plan: &[PlannedRun]) -> String {
    let mut axes: Vec<(String, Vec<String>)> = Vec::new();
    for run in plan {
        for (k, _) in &run.axes {
            if !axes.iter().any(|(a, _)| a == k) {
                axes.push((k.clone(), Vec::new()));
            }
        }
    }
    for run in plan {
        let mut resolved: Option<toml::Table> = None;
        for (k, values) in axes.iter_mut() {
            let v = match run.axes.iter().find(|(a, _)| a == k) {
                Some((_, v)) => Some(v.clone()),
                None => {
                    let table = resolved.get_or_insert_with(|| {
                        toml::Table::try_from(&run.config).unwrap_or_default()
                    });
                    table.get(k.as_str()).map(value_label)
                }
            };
            if let Some(v) = v
                && !values.contains(&v)
            {
                values.push(v);
            }
        }
    }
    let n = plan.len();
    let runs = if n == 1 {
        "1 run".to_string()
    } else {
        format!("{n} runs")
    };
    if axes.is_empty() {
        return format!("no axes (the base config) → {runs}");
    }
    let product: usize = axes.iter().map(|(_, v)| v.len()).product();
    let text = axes
        .iter()
        .map(|(k, v)| format!("{k} = [{}]", v.join(", ")))
        .collect::<Vec<_>>()
        .join(" × ");
    if product == n {
        format!("{text} → {runs}")
    } else {
        format!("{text} → {runs} (a union of arms, not the whole product)")
    }
}

fn value_label(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn cartesian(axes: &[(String, Vec<toml::Value>)]) -> Vec<Vec<(String, toml::Value)>> {
    let mut out: Vec<Vec<(String, toml::Value)>> = vec![vec![]];
    for (k, values) in axes {
        let mut next = Vec::with_capacity(out.len() * values.len());
        for prefix in &out {
            for v in values {
                let mut c = prefix.clone();
                c.push((k.clone(), v.clone()));
                next.push(c);
            }
        }
        out = next;
    }
    out
}

/// Directory holding the sweep files: `$LAB_SWEEPS_DIR`, else `<lab root>/sweeps`
/// ([`crate::paths`]).
pub fn sweeps_dir() -> PathBuf {
    crate::paths::sweeps_dir()
}

/// The default results folder of sweep `name`: `<lab root>/results/<name>` ([`crate::paths`]).
pub fn default_results_dir(name: &str) -> PathBuf {
    crate::paths::default_results(name)
}

/// Names of the available sweeps (sorted).
pub fn list_sweeps(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    let p = e.path();
                    (p.extension().is_some_and(|x| x == "toml"))
                        .then(|| p.file_stem().unwrap().to_string_lossy().into_owned())
                })
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Resolve a sweep name (or a path to a `.toml` file) to its spec.
pub fn find_sweep(name: &str, dir: &Path) -> Result<SweepSpec, SpecError> {
    let as_path = Path::new(name);
    if name.ends_with(".toml") && as_path.is_file() {
        return SweepSpec::load(as_path);
    }
    // A path (not a bare name): say what is wrong with it, not that a sweep is unknown.
    if name.ends_with(".toml") || name.contains(std::path::MAIN_SEPARATOR) || as_path.is_dir() {
        return Err(SpecError::NotASweepFile {
            path: as_path.to_path_buf(),
            why: if as_path.is_dir() {
                "it is a folder; give a sweep name (`lab sweep --list`) or a .toml file".into()
            } else if as_path.exists() {
                "a sweep file's name ends in .toml".into()
            } else {
                "no such file".into()
            },
        });
    }
    let path = dir.join(format!("{name}.toml"));
    if !path.is_file() {
        let available = list_sweeps(dir);
        return Err(SpecError::UnknownSweep {
            name: name.to_string(),
            available: if available.is_empty() {
                format!("none (no .toml file in {})", dir.display())
            } else {
                available.join(", ")
            },
        });
    }
    SweepSpec::load(&path)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
description = "test"
[base]
task = "block"
variant = "copy"
vocab_size = 16
seq_len = 32
block_len = 4
noise = 0.0
encoding = "rope"
rope_base = 10000.0
pair_layout = "adjacent"
d_model = 16
n_layers = 1
n_heads = 2
d_ff = 32
steps = 4
batch_size = 2
lr = 0.001
warmup_steps = 1
min_lr_ratio = 0.1
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
adam_eps = 1e-8
grad_clip = 1.0
eval_every = 2
eval_batches = 1
seed = 0
"#;

    fn parse(extra: &str) -> Result<SweepSpec, SpecError> {
        SweepSpec::parse(Path::new("sweeps/t.toml"), &format!("{BASE}{extra}"))
    }

    #[test]
    fn preset_jobs_default_and_range() {
        let spec = parse("[presets.two]\njobs = 2\n[presets.plain]\n").unwrap();
        assert_eq!(spec.preset_jobs("two"), Some(2));
        assert_eq!(spec.preset_jobs("plain"), None);
        assert_eq!(spec.preset_jobs("absent"), None);
        let e = parse("[presets.many]\njobs = 0\n").unwrap_err().to_string();
        assert!(
            e.contains("jobs = 0 is out of range: must be in 1..=256"),
            "{e}"
        );
    }

    #[test]
    fn grid_and_arms_expand() {
        let spec = parse(
            r#"
[grid]
block_len = [4, 8]
[[arms]]
encoding = ["rope"]
seed = [0, 1, 2]
[[arms]]
encoding = ["nope"]
seed = [0]
[presets.small]
grid = { block_len = [4] }
"#,
        )
        .unwrap();
        assert_eq!(spec.name, "t");
        let runs = spec.expand("small").unwrap();
        assert_eq!(runs.len(), 4); // 1 width × (3 rope seeds + 1 nope seed)
        let runs = parse("[grid]\nblock_len = [4, 8]\n[presets.x]\n")
            .unwrap()
            .expand("x")
            .unwrap();
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[1].config.task.block().unwrap().block_len, 8);
        assert_eq!(
            runs[1].axes,
            vec![("block_len".to_string(), "8".to_string())]
        );
    }

    #[test]
    fn unknown_key_suggests_closest() {
        let err = parse("[grid]\nblok_len = [4]\n").unwrap_err().to_string();
        assert_eq!(
            err,
            "sweeps/t.toml: unknown key `blok_len` in [grid]; did you mean `block_len`?"
        );
    }

    #[test]
    fn syntax_error_has_line_and_column() {
        let err = parse("[grid]\nblock_len = [4, \n").unwrap_err().to_string();
        // BASE is 29 lines (a leading newline, description, [base], 26 fields); [grid] is 30.
        assert_eq!(err, "sweeps/t.toml:31:16: unclosed array, expected `]`");
    }

    #[test]
    fn invalid_value_names_run_and_field() {
        let err = parse("[grid]\nblock_len = [4, 99]\n[presets.q]\n")
            .unwrap()
            .expand("q")
            .unwrap_err()
            .to_string();
        assert!(err.contains("preset q, block_len = 99"), "{err}");
        assert!(err.contains("block_len = 99 is out of range"), "{err}");
    }

    #[test]
    fn empty_axis_and_unknown_preset() {
        let spec = parse("[grid]\nblock_len = []\n[presets.q]\n").unwrap();
        assert!(matches!(spec.expand("q"), Err(SpecError::EmptyGrid { .. })));
        let err = spec.expand("nope").unwrap_err().to_string();
        assert!(
            err.contains("--preset nope: ")
                && err.contains("has no preset `nope`; available presets: q"),
            "{err}"
        );
    }

    #[test]
    fn unknown_section_and_value_suggest_closest() {
        let err = parse("[gird]\nblock_len = [4]\n").unwrap_err().to_string();
        assert_eq!(
            err,
            "sweeps/t.toml:30:2: unknown field `gird`, expected one of `description`, `claim`, `default_preset`, `base`, `grid`, `arms`, `presets`, `evals`, `select`; did you mean `grid`?"
        );
        let err = parse("[grid]\nencoding = [\"ropee\"]\n[presets.q]\n")
            .unwrap()
            .expand("q")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "sweeps/t.toml: preset q, encoding = ropee: encoding: unknown encoding `ropee`, expected one of"
            ),
            "{err}"
        );
        assert!(err.ends_with("; did you mean `rope`?"), "{err}");
        assert_eq!(hint_unknown("invalid type: string"), "invalid type: string");
    }

    fn sets(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn axis(runs: &[PlannedRun], f: impl Fn(&RunConfig) -> String) -> Vec<String> {
        runs.iter().map(|r| f(&r.config)).collect()
    }

    const GRID: &str = "[grid]\nblock_len = [4, 8]\n[[arms]]\nencoding = [\"rope\"]\nseed = [0, 1]\n[[arms]]\nencoding = [\"nope\"]\nseed = [0]\n[presets.quick]\nbase = { steps = 6 }\n";

    #[test]
    fn a_scalar_set_fixes_a_field_everywhere_and_a_list_makes_it_an_axis() {
        let plain = parse(GRID).unwrap().expand("quick").unwrap();
        assert_eq!(plain.len(), 6); // 2 widths × (2 rope seeds + 1 nope seed)
        assert!(plain.iter().all(|r| r.config.steps == 6));

        // A scalar beats the preset's base and removes the grid axis.
        let mut spec = parse(GRID).unwrap();
        spec.set(&sets(&["steps=9", "block_len=16"])).unwrap();
        let runs = spec.expand("quick").unwrap();
        assert_eq!(runs.len(), 3);
        assert!(
            runs.iter()
                .all(|r| r.config.steps == 9 && r.config.dep_width() == 16)
        );
        // An overridden run is a new run: no id is shared with the plain plan.
        let ids: std::collections::HashSet<String> =
            plain.iter().map(|r| r.config.run_id()).collect();
        assert!(runs.iter().all(|r| !ids.contains(&r.config.run_id())));

        // A list replaces the arms' axis: seeds 5, 6 for both encodings.
        let mut spec = parse(GRID).unwrap();
        spec.set(&sets(&["seed=[5, 6]"])).unwrap();
        let runs = spec.expand("quick").unwrap();
        assert_eq!(runs.len(), 8); // 2 widths × 2 encodings × 2 seeds
        let mut seeds = axis(&runs, |c| c.seed.to_string());
        seeds.sort();
        seeds.dedup();
        assert_eq!(seeds, ["5", "6"]);

        // Arms that become identical are one run: encoding fixed to nope, seeds as the arms.
        let mut spec = parse(GRID).unwrap();
        spec.set(&sets(&["encoding=nope"])).unwrap();
        let runs = spec.expand("quick").unwrap();
        assert_eq!(runs.len(), 4); // 2 widths × seeds {0, 1}: the second arm's seed 0 is the first's
        assert!(
            runs.iter()
                .all(|r| r.config.encoding.kind() == crate::model::Encoding::Nope)
        );
        // The last of two sets of one field wins.
        let mut spec = parse(GRID).unwrap();
        spec.set(&sets(&["steps=7", "steps=8"])).unwrap();
        assert!(
            spec.expand("quick")
                .unwrap()
                .iter()
                .all(|r| r.config.steps == 8)
        );
        assert_eq!(spec.sets(), ["steps=7", "steps=8"]);
    }

    #[test]
    fn dotted_sets_edit_the_file_as_if_it_said_so() {
        let mut spec = parse(GRID).unwrap();
        spec.set(&sets(&[
            "presets.quick.base.lr=0.01",
            "presets.quick.jobs=3",
            "grid.block_len=[2]",
        ]))
        .unwrap();
        let runs = spec.expand("quick").unwrap();
        assert_eq!(runs.len(), 3);
        assert!(
            runs.iter()
                .all(|r| r.config.lr == 0.01 && r.config.dep_width() == 2)
        );
        assert_eq!(spec.preset_jobs("quick"), Some(3));
        // base.F is what the file's base says: a preset's base still wins over it.
        let mut spec = parse(GRID).unwrap();
        spec.set(&sets(&["base.steps=11"])).unwrap();
        assert!(
            spec.expand("quick")
                .unwrap()
                .iter()
                .all(|r| r.config.steps == 6)
        );
    }

    #[test]
    fn bad_sets_are_one_line_errors_naming_the_override() {
        let err = |v: &str| {
            let mut spec = parse(GRID).unwrap();
            match spec.set(&sets(&[v])) {
                Err(e) => e.to_string(),
                Ok(()) => match spec.expand("quick") {
                    Err(e) => e.to_string(),
                    Ok(_) => panic!("{v} was accepted"),
                },
            }
        };
        assert_eq!(
            err("stepz=3"),
            "--set stepz=3: unknown config field `stepz`; did you mean `steps`?"
        );
        assert_eq!(
            err("steps"),
            "--set steps: expected KEY=VALUE, e.g. --set steps=1000 or --set block_len=[4,16]"
        );
        assert_eq!(
            err("grid.block_len=4"),
            "--set grid.block_len=4: a grid axis takes a non-empty list, e.g. [4, 16]"
        );
        assert_eq!(
            err("presets.slow.base.lr=1"),
            "--set presets.slow.base.lr=1: unknown preset `slow`; available presets: quick"
        );
        assert_eq!(
            err("presets.quick.jobs=0"),
            "--set presets.quick.jobs=0: jobs must be an integer in 1..=256"
        );
        assert!(err("arms.0.seed=[1]").starts_with("--set arms.0.seed=[1]: KEY is a config field"));
        assert_eq!(
            err("seed=[]"),
            "--set seed=[]: an axis needs at least one value"
        );
        // A value out of range is reported by the expansion, as the override typed (issue 51:
        // before, the message started with the sweep file, as if the file were wrong).
        let e = err("steps=0");
        assert!(
            e.starts_with("--set steps=0: steps = 0 is out of range")
                && e.contains("(preset quick, "),
            "{e}"
        );
    }

    /// A bracketed list of bare words is a list of strings, as a bare word is a string (before,
    /// `encoding=[rope,pope]` was the one string `[rope,pope]`: "unknown encoding").
    #[test]
    fn a_list_of_bare_words_is_a_list_of_strings() {
        let s = |v: &str| toml::Value::String(v.into());
        assert_eq!(
            parse_override_value("[rope,pope]"),
            toml::Value::Array(vec![s("rope"), s("pope")])
        );
        assert_eq!(
            parse_override_value("[p-rope, 4]"),
            toml::Value::Array(vec![s("p-rope"), toml::Value::Integer(4)])
        );
        assert_eq!(
            parse_override_value("[\"rope\", \"pope\"]"),
            toml::Value::Array(vec![s("rope"), s("pope")])
        );
        assert_eq!(parse_override_value("rope"), s("rope"));
        let ids = |set: &str| -> Vec<String> {
            let mut spec = parse(GRID).unwrap();
            spec.set(&sets(&[set])).unwrap();
            let runs = spec.expand("quick").unwrap();
            runs.iter().map(|r| r.config.run_id()).collect()
        };
        let bare = ids("encoding=[pope,nope]");
        assert_eq!(bare, ids("encoding=[\"pope\", \"nope\"]"));
        assert!(!bare.is_empty());
    }

    /// An axis only one arm varies lists the other runs' resolved value too (the NoPE control's
    /// 300 fixed steps beside the base's 1000: `steps = [1000, 300]`, not `[300]`).
    #[test]
    fn an_arm_only_axis_lists_the_base_value_too() {
        let spec = "[grid]\nblock_len = [4, 8]\n[[arms]]\nencoding = [\"rope\"]\n[[arms]]\nencoding = [\"nope\"]\nsteps = [300]\n[presets.quick]\nbase = { steps = 1000 }\n";
        let runs = parse(spec).unwrap().expand("quick").unwrap();
        assert_eq!(
            describe_plan(&runs),
            "block_len = [4, 8] × encoding = [rope, nope] × steps = [1000, 300] → 4 runs (a union of arms, not the whole product)"
        );
    }

    #[test]
    fn the_resolved_grid_lists_each_axis_once() {
        let runs = parse(GRID).unwrap().expand("quick").unwrap();
        assert_eq!(
            describe_plan(&runs),
            "block_len = [4, 8] × encoding = [rope, nope] × seed = [0, 1] → 6 runs (a union of arms, not the whole product)"
        );
        let mut spec = parse(GRID).unwrap();
        spec.set(&sets(&["seed=[3]"])).unwrap();
        assert_eq!(
            describe_plan(&spec.expand("quick").unwrap()),
            "block_len = [4, 8] × seed = [3] × encoding = [rope, nope] → 4 runs"
        );
    }
}

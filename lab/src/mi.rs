//! Mutual-information profiles of corpora, files and tasks (`lab mi`, `lab sweep mi-profiles`):
//! SCIENCE.md section 4. The estimator is [`tasks::mi`]; corpora and granularities are
//! [`tasks::corpus`] and [`tasks::granularity`]. Tables `mi` and `mi_summary` are documented in
//! `results/README.md`.
//!
//! A sweep file with `kind = "mi"` is an MI sweep (see `sweeps/mi-profiles.toml`):
//!
//! ```toml
//! kind = "mi"
//! description = "..."
//! [base]                      # defaults of every profile
//! max_lag = 1024
//! estimator = "miller-madow"  # or plug-in, grassberger
//! n_examples = 4000           # task profiles: examples of the train split
//! seed = 0
//! [[profiles]]                # one corpus at several granularities
//! corpus = "shakespeare"
//! granularities = ["char", "word", "bpe-2048"]
//! [[profiles]]                # a task, seen as the model sees it (input r back vs target)
//! task = "block"
//! params = ["variant=copy", "block_len=8"]
//! max_lag = 64                # any base key can be overridden per profile
//! [presets.smoke]
//! base = { max_lag = 16 }     # overrides of [base]
//! profiles = [...]            # optional: replaces the list
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;
use serde::Deserialize;
use tasks::Split;
use tasks::granularity::{Granularity, TokenStream, corpus_stream, text_stream};
use tasks::mi::{
    CurveRef, Estimator, MiConfig, MiProfile, collapse_error, profile_examples, profile_stream,
};

use crate::store::{ResultsError, TableBuilder, write_batch};

/// Errors of `lab mi` (one line each).
#[derive(Debug, thiserror::Error)]
pub enum MiError {
    /// Corpus fetch/load failure.
    #[error(transparent)]
    Corpus(#[from] tasks::corpus::CorpusError),
    /// Bad setting.
    #[error(transparent)]
    Task(#[from] tasks::TaskError),
    /// Task generation failure.
    #[error(transparent)]
    Gen(#[from] crate::generate::GenError),
    /// Table writing failure.
    #[error(transparent)]
    Results(#[from] ResultsError),
    /// Bad sweep file or input.
    #[error("{0}")]
    Input(String),
}

/// What to profile.
#[derive(Clone, Debug, PartialEq)]
pub enum MiSource {
    /// A corpus from the data folder.
    Corpus(String),
    /// A UTF-8 text file.
    Input(PathBuf),
    /// A task with `key=value` parameters (as `lab gen`), `n_examples` of the train split.
    Task {
        /// Task name.
        task: String,
        /// Parameters.
        params: Vec<String>,
        /// Number of examples.
        n_examples: usize,
    },
}

impl MiSource {
    /// The source given by exactly one of `lab mi`'s `--corpus`, `--input` and `--task` (with
    /// its `--param`s and `--n-examples`).
    ///
    /// # Errors
    /// [`MiError::Input`] when none or several are given.
    pub fn from_options(
        corpus: Option<String>,
        input: Option<PathBuf>,
        task: Option<String>,
        params: Vec<String>,
        n_examples: usize,
    ) -> Result<Self, MiError> {
        match (corpus, input, task) {
            (Some(c), None, None) => Ok(MiSource::Corpus(c)),
            (None, Some(f), None) => Ok(MiSource::Input(f)),
            (None, None, Some(task)) => Ok(MiSource::Task {
                task,
                params,
                n_examples,
            }),
            _ => Err(MiError::Input(
                "give one of --corpus NAME, --input FILE or --task TASK".to_string(),
            )),
        }
    }
}

/// One profile to compute.
#[derive(Clone, Debug)]
pub struct MiRequest {
    /// Source.
    pub source: MiSource,
    /// Granularity (`None`: the source's default: `char` for text, `token` for chorales and tasks).
    pub granularity: Option<String>,
    /// Estimator settings (max lag, estimator, shuffles, seed).
    pub config: MiConfig,
    /// Data folder (corpora, cached tokenizers).
    pub data_dir: PathBuf,
    /// Label of a task profile in the `corpus` column (default `task:<name>`).
    pub label: Option<String>,
}

/// A computed profile with its provenance.
#[derive(Clone, Debug)]
pub struct MiResult {
    /// `corpus` column: corpus name, `task:<name>` (or the sweep's label), or the input file name.
    pub corpus: String,
    /// Granularity name.
    pub granularity: String,
    /// Vocabulary size of the tokenisation.
    pub vocab_size: usize,
    /// Tokens in the stream (tasks: scored targets).
    pub n_tokens: usize,
    /// Mean characters per token.
    pub chars_per_token: f64,
    /// The profile.
    pub profile: MiProfile,
    /// Collapse error against the other granularities of the same corpus (filled by
    /// [`fill_collapse`]).
    pub collapse_error: Option<f64>,
    /// Seconds to tokenise and estimate.
    pub wall_time_s: f64,
}

fn default_granularity(source: &MiSource) -> &'static str {
    match source {
        MiSource::Corpus(name) if name == "chorales" => "token",
        MiSource::Task { .. } => "token",
        _ => "char",
    }
}

/// Compute one profile.
///
/// # Errors
/// [`MiError`]: missing corpus (with the `make data` hint), bad granularity or lag, bad task
/// parameters, unreadable input.
pub fn compute(req: &MiRequest) -> Result<MiResult, MiError> {
    compute_with(req, &mut |_, _, _| {})
}

/// [`compute`], calling `ready(source name, granularity, tokens)` once the token stream of a
/// corpus or file is built (every input checked), before its profile is measured.
///
/// # Errors
/// As [`compute`].
pub fn compute_with(
    req: &MiRequest,
    ready: &mut dyn FnMut(&str, &str, usize),
) -> Result<MiResult, MiError> {
    let t0 = std::time::Instant::now();
    let gname = req
        .granularity
        .clone()
        .unwrap_or_else(|| default_granularity(&req.source).to_string());
    let (corpus, stream): (String, Option<TokenStream>) = match &req.source {
        MiSource::Corpus(name) => {
            let g = Granularity::parse(&gname)?;
            (name.clone(), Some(corpus_stream(&req.data_dir, name, g)?))
        }
        MiSource::Input(path) => {
            let g = Granularity::parse(&gname)?;
            let text = std::fs::read_to_string(path)
                .map_err(|e| MiError::Input(format!("--input {}: {e}", path.display())))?;
            let s = match g {
                Granularity::Bpe(v) => {
                    let h = blake3::hash(text.as_bytes()).to_hex();
                    let cache = req
                        .data_dir
                        .join("tokenizers")
                        .join(format!("input-{}-bpe-{v}.json", &h[..16]));
                    tasks::granularity::bpe_stream(&text, v, &cache, "input")?
                }
                _ => text_stream(&text, g)?,
            };
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| path.display().to_string());
            (name, Some(s))
        }
        MiSource::Task { task, .. } => {
            if gname != "token" {
                return Err(MiError::Input(format!(
                    "granularity {gname} is not offered for a task: tasks have `token` only"
                )));
            }
            (
                req.label.clone().unwrap_or_else(|| format!("task:{task}")),
                None,
            )
        }
    };
    let (profile, vocab_size, n_tokens, cpt) = match (&req.source, stream) {
        (_, Some(s)) => {
            if s.ids.len() < 2 {
                return Err(MiError::Input(format!("{corpus}: fewer than 2 tokens")));
            }
            req.config.validate(s.ids.len())?;
            ready(&corpus, &gname, s.ids.len());
            let p = profile_stream(&s.ids, &req.config)?;
            (p, s.vocab_size, s.ids.len(), s.chars_per_token)
        }
        (
            MiSource::Task {
                task,
                params,
                n_examples,
            },
            None,
        ) => {
            let ex = crate::generate::task_examples(
                task,
                params,
                *n_examples,
                req.config.seed,
                Split::Train,
            )?;
            // `max_lag = 0` (`lab mi --task` without --max-lag): lags up to 256, or every lag
            // the examples have when they are shorter.
            let mut config = req.config.clone();
            if config.max_lag == 0 {
                let seq_len = ex.iter().map(|e| e.input.len()).max().unwrap_or(0);
                config.max_lag = seq_len.saturating_sub(1).clamp(1, 256);
            }
            let p = profile_examples(&ex, &config)?;
            let (v, n) = (p.vocab_size, p.n_tokens);
            (p, v, n, 1.0)
        }
        _ => unreachable!("text sources always have a stream"),
    };
    Ok(MiResult {
        corpus,
        granularity: gname,
        vocab_size,
        n_tokens,
        chars_per_token: cpt,
        profile,
        collapse_error: None,
        wall_time_s: t0.elapsed().as_secs_f64(),
    })
}

/// Fill [`MiResult::collapse_error`] for every corpus with at least two granularities.
pub fn fill_collapse(results: &mut [MiResult]) {
    let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, r) in results.iter().enumerate() {
        groups.entry(r.corpus.clone()).or_default().push(i);
    }
    for idx in groups.values() {
        let curves: Vec<CurveRef<'_>> = idx
            .iter()
            .map(|&i| CurveRef {
                lags: &results[i].profile.lags,
                mutual_info: &results[i].profile.mutual_info,
                significant: &results[i].profile.significant,
                chars_per_token: results[i].chars_per_token,
            })
            .collect();
        let errs = collapse_error(&curves);
        for (&i, e) in idx.iter().zip(errs) {
            results[i].collapse_error = e;
        }
    }
}

/// The `mi` table: one row per (profile, lag).
pub fn mi_table(results: &[MiResult]) -> RecordBatch {
    let rows: usize = results.iter().map(|r| r.profile.lags.len()).sum();
    let mut corpus = Vec::with_capacity(rows);
    let mut gran = Vec::with_capacity(rows);
    let (mut vocab, mut ntok, mut cpt) = (Vec::new(), Vec::new(), Vec::new());
    let (mut lag, mut lag_chars, mut mi, mut plug) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut smean, mut shi, mut sig, mut est, mut npairs) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for r in results {
        let p = &r.profile;
        for i in 0..p.lags.len() {
            corpus.push(r.corpus.clone());
            gran.push(r.granularity.clone());
            vocab.push(r.vocab_size as i64);
            ntok.push(r.n_tokens as i64);
            cpt.push(r.chars_per_token);
            lag.push(p.lags[i] as i64);
            lag_chars.push(p.lags[i] as f64 * r.chars_per_token);
            mi.push(p.mutual_info[i]);
            plug.push(p.plug_in[i]);
            smean.push(p.shuffle_mean[i]);
            shi.push(p.shuffle_hi[i]);
            sig.push(p.significant[i]);
            est.push(p.estimator.name().to_string());
            npairs.push(p.n_pairs[i] as i64);
        }
    }
    TableBuilder::new(rows)
        .str("corpus", corpus)
        .str("granularity", gran)
        .i64("vocab_size", vocab)
        .i64("n_tokens", ntok)
        .f64("chars_per_token", cpt)
        .i64("lag", lag)
        .f64("lag_chars", lag_chars)
        .f64("mutual_info", mi)
        .f64("mi_shuffle_mean", smean)
        .f64("mi_shuffle_hi", shi)
        .bool("significant", sig)
        .str("estimator", est)
        .f64("mi_plug_in", plug)
        .i64("n_pairs", npairs)
        .build()
}

fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

/// The `mi_summary` table: one row per profile.
pub fn summary_table(results: &[MiResult]) -> RecordBatch {
    let n = results.len();
    let s = |f: &dyn Fn(&MiResult) -> String| results.iter().map(f).collect::<Vec<_>>();
    let i = |f: &dyn Fn(&MiResult) -> i64| results.iter().map(f).collect::<Vec<_>>();
    let oi = |f: &dyn Fn(&MiResult) -> Option<i64>| results.iter().map(f).collect::<Vec<_>>();
    let x = |f: &dyn Fn(&MiResult) -> f64| results.iter().map(f).collect::<Vec<_>>();
    let ox = |f: &dyn Fn(&MiResult) -> Option<f64>| results.iter().map(f).collect::<Vec<_>>();
    TableBuilder::new(n)
        .str("corpus", s(&|r| r.corpus.clone()))
        .str("granularity", s(&|r| r.granularity.clone()))
        .i64("vocab_size", i(&|r| r.vocab_size as i64))
        .i64("n_tokens", i(&|r| r.n_tokens as i64))
        .f64("chars_per_token", x(&|r| r.chars_per_token))
        .str("estimator", s(&|r| r.profile.estimator.name().to_string()))
        .i64("max_lag", i(&|r| r.profile.lags.len() as i64))
        .opt_i64("dep_width", oi(&|r| r.profile.dep_width.map(|w| w as i64)))
        .opt_f64(
            "dep_width_chars",
            ox(&|r| r.profile.dep_width.map(|w| w as f64 * r.chars_per_token)),
        )
        .opt_i64(
            "max_significant_lag",
            oi(&|r| r.profile.max_significant_lag.map(|w| w as i64)),
        )
        .str(
            "decay_model",
            s(&|r| r.profile.decay.model.name().to_string()),
        )
        .opt_f64("decay_exponent", ox(&|r| finite(r.profile.decay.exponent)))
        .opt_f64("decay_length", ox(&|r| finite(r.profile.decay.length)))
        .opt_f64("r2_power", ox(&|r| finite(r.profile.decay.r2_power)))
        .opt_f64("r2_exp", ox(&|r| finite(r.profile.decay.r2_exp)))
        .opt_f64("collapse_error", ox(&|r| r.collapse_error))
        .f64("band_z", x(&|r| r.profile.band_z))
        .f64("mi_lag1", x(&|r| r.profile.mutual_info[0]))
        .f64("wall_time_s", x(&|r| r.wall_time_s))
        .build()
}

/// The profile as CSV (header `lag,lag_chars,mutual_info,mi_shuffle_mean,mi_shuffle_hi,significant`).
pub fn csv(r: &MiResult) -> String {
    let p = &r.profile;
    let mut out =
        String::from("lag,lag_chars,mutual_info,mi_shuffle_mean,mi_shuffle_hi,significant\n");
    for i in 0..p.lags.len() {
        out.push_str(&format!(
            "{},{},{:.9e},{:.9e},{:.9e},{}\n",
            p.lags[i],
            p.lags[i] as f64 * r.chars_per_token,
            p.mutual_info[i],
            p.shuffle_mean[i],
            p.shuffle_hi[i],
            p.significant[i]
        ));
    }
    out
}

/// One line per profile: W, decay, collapse.
pub fn summary_lines(results: &[MiResult]) -> String {
    let mut out = format!(
        "{:<22} {:<10} {:>9} {:>6} {:>6} {:>8} {:>7} {:>7} {:>9} {:>8} {:>8}\n",
        "corpus",
        "gran.",
        "tokens",
        "c/tok",
        "W",
        "W chars",
        "maxsig",
        "decay",
        "α | ℓ",
        "I(1)",
        "collapse"
    );
    for r in results {
        let p = &r.profile;
        let d = &p.decay;
        let shape = match d.model {
            tasks::mi::DecayModel::Power => format!("{:.3}", d.exponent),
            tasks::mi::DecayModel::Exp => format!("{:.2}", d.length),
            tasks::mi::DecayModel::None => "-".into(),
        };
        let opt = |v: Option<usize>| v.map(|w| w.to_string()).unwrap_or_else(|| "-".into());
        out.push_str(&format!(
            "{:<22} {:<10} {:>9} {:>6.2} {:>6} {:>8} {:>7} {:>7} {:>9} {:>8.4} {:>8}\n",
            r.corpus,
            r.granularity,
            r.n_tokens,
            r.chars_per_token,
            opt(p.dep_width),
            p.dep_width
                .map(|w| format!("{:.1}", w as f64 * r.chars_per_token))
                .unwrap_or_else(|| "-".into()),
            opt(p.max_significant_lag),
            d.model.name(),
            shape,
            p.mutual_info[0],
            r.collapse_error
                .map(|e| format!("{e:.3}"))
                .unwrap_or_else(|| "-".into()),
        ));
    }
    out
}

// ---- MI sweeps ----

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct Settings {
    max_lag: Option<usize>,
    estimator: Option<String>,
    n_examples: Option<usize>,
    n_shuffles: Option<usize>,
    seed: Option<u64>,
}

impl Settings {
    fn over(&self, base: &Settings) -> Settings {
        Settings {
            max_lag: self.max_lag.or(base.max_lag),
            estimator: self.estimator.clone().or_else(|| base.estimator.clone()),
            n_examples: self.n_examples.or(base.n_examples),
            n_shuffles: self.n_shuffles.or(base.n_shuffles),
            seed: self.seed.or(base.seed),
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct ProfileSpec {
    corpus: Option<String>,
    #[serde(default)]
    granularities: Vec<String>,
    task: Option<String>,
    #[serde(default)]
    params: Vec<String>,
    label: Option<String>,
    max_lag: Option<usize>,
    estimator: Option<String>,
    n_examples: Option<usize>,
    n_shuffles: Option<usize>,
    seed: Option<u64>,
}

impl ProfileSpec {
    fn settings(&self) -> Settings {
        Settings {
            max_lag: self.max_lag,
            estimator: self.estimator.clone(),
            n_examples: self.n_examples,
            n_shuffles: self.n_shuffles,
            seed: self.seed,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MiPreset {
    #[serde(default)]
    description: String,
    #[serde(default)]
    base: Settings,
    profiles: Option<Vec<ProfileSpec>>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MiSweepFile {
    kind: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    claim: String,
    default_preset: Option<String>,
    #[serde(default)]
    base: Settings,
    #[serde(default)]
    profiles: Vec<ProfileSpec>,
    #[serde(default)]
    presets: BTreeMap<String, MiPreset>,
}

/// A parsed MI sweep file.
#[derive(Clone, Debug)]
pub struct MiSweep {
    /// Name (file stem).
    pub name: String,
    /// Description.
    pub description: String,
    /// The claim the sweep tests (`claim = "…"`; `lab report`).
    pub claim: String,
    /// Preset used when none is given.
    pub default_preset: String,
    file: MiSweepFile,
    path: PathBuf,
}

/// Whether the sweep file at `path` is an MI sweep (`kind = "mi"` at the top).
pub fn is_mi_sweep(path: &Path) -> bool {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| t.parse::<toml::Table>().ok())
        .and_then(|t| t.get("kind").and_then(|k| k.as_str().map(|s| s == "mi")))
        .unwrap_or(false)
}

/// Refuse `lab sweep` options that only training sweeps have, for the MI sweep `name`.
/// `given` lists each such option as it is spelled on the command line (e.g. `"--shard"`)
/// when the user set it. An MI sweep is one process that spreads its lags over every core
/// (rayon) and finishes in minutes, so it has no jobs, shards, Slurm script, failed-run retry
/// or device.
///
/// # Errors
/// [`MiError::Input`] naming the first option given, e.g. `--shard does not apply to
/// mi-profiles: it is an MI sweep (kind = "mi"), one process on this machine's cores; drop
/// the option`.
pub fn check_mi_sweep_options(name: &str, given: &[&str]) -> Result<(), MiError> {
    match given.first() {
        None => Ok(()),
        Some(opt) => Err(MiError::Input(format!(
            "{opt} does not apply to {name}: it is an MI sweep (kind = \"mi\"), one process on \
             this machine's cores; drop the option"
        ))),
    }
}

impl MiSweep {
    /// Parse an MI sweep file.
    ///
    /// # Errors
    /// [`MiError::Input`] naming the file and the problem.
    pub fn load(path: &Path) -> Result<Self, MiError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| MiError::Input(format!("{}: {e}", path.display())))?;
        let file: MiSweepFile = toml::from_str(&text).map_err(|e| {
            MiError::Input(format!(
                "{}: {}",
                path.display(),
                e.message().replace('\n', " ")
            ))
        })?;
        if file.kind != "mi" {
            return Err(MiError::Input(format!(
                "{}: kind = \"{}\": an MI sweep has kind = \"mi\"",
                path.display(),
                file.kind
            )));
        }
        let default_preset = file
            .default_preset
            .clone()
            .or_else(|| file.presets.keys().next().cloned())
            .unwrap_or_else(|| "default".into());
        Ok(MiSweep {
            name: path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
            description: file.description.clone(),
            claim: file.claim.clone(),
            default_preset,
            file,
            path: path.to_path_buf(),
        })
    }

    /// Preset names and descriptions.
    pub fn presets(&self) -> Vec<(String, String)> {
        self.file
            .presets
            .iter()
            .map(|(k, p)| (k.clone(), p.description.clone()))
            .collect()
    }

    /// The requests of `preset`, validated.
    ///
    /// # Errors
    /// [`MiError::Input`] naming the file, preset and field.
    pub fn requests(&self, preset: &str, data_dir: &Path) -> Result<Vec<MiRequest>, MiError> {
        let ctx =
            |m: String| MiError::Input(format!("{}: preset {preset}: {m}", self.path.display()));
        let p = self.file.presets.get(preset);
        if p.is_none() && !(self.file.presets.is_empty() && preset == "default") {
            return Err(ctx(format!(
                "unknown preset; available: {}",
                self.file
                    .presets
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let base = p
            .map(|p| p.base.over(&self.file.base))
            .unwrap_or(self.file.base.clone());
        let profiles = p
            .and_then(|p| p.profiles.clone())
            .unwrap_or_else(|| self.file.profiles.clone());
        let mut out = Vec::new();
        for (k, prof) in profiles.iter().enumerate() {
            let s = prof.settings().over(&base);
            let est = Estimator::parse(s.estimator.as_deref().unwrap_or("miller-madow"))
                .map_err(|e| ctx(format!("profile {}: {e}", k + 1)))?;
            let config = MiConfig {
                max_lag: s.max_lag.unwrap_or(256),
                estimator: est,
                n_shuffles: s.n_shuffles.unwrap_or(8),
                seed: s.seed.unwrap_or(0),
                ..MiConfig::default()
            };
            match (&prof.corpus, &prof.task) {
                (Some(c), None) => {
                    tasks::corpus::spec(c).map_err(|e| ctx(format!("profile {}: {e}", k + 1)))?;
                    let grans = if prof.granularities.is_empty() {
                        vec![default_granularity(&MiSource::Corpus(c.clone())).to_string()]
                    } else {
                        prof.granularities.clone()
                    };
                    for g in grans {
                        Granularity::parse(&g)
                            .map_err(|e| ctx(format!("profile {}: {e}", k + 1)))?;
                        out.push(MiRequest {
                            source: MiSource::Corpus(c.clone()),
                            granularity: Some(g),
                            config: config.clone(),
                            data_dir: data_dir.to_path_buf(),
                            label: None,
                        });
                    }
                }
                (None, Some(t)) => out.push(MiRequest {
                    source: MiSource::Task {
                        task: t.clone(),
                        params: prof.params.clone(),
                        n_examples: s.n_examples.unwrap_or(2000),
                    },
                    granularity: None,
                    config,
                    data_dir: data_dir.to_path_buf(),
                    label: prof.label.clone(),
                }),
                _ => {
                    return Err(ctx(format!(
                        "profile {}: give exactly one of `corpus` or `task`",
                        k + 1
                    )));
                }
            }
        }
        Ok(out)
    }
}

/// What [`run_mi_sweep`] produced.
#[derive(Debug)]
pub struct MiSweepReport {
    /// The computed profiles (with collapse errors), in request order.
    pub results: Vec<MiResult>,
    /// The profiles that failed: a description of the request and the one-line error.
    pub failures: Vec<(String, String)>,
}

/// Run an MI sweep: every request in order (a failing profile is reported and skipped), then
/// write `mi.parquet` and `mi_summary.parquet` under `out_dir` with the profiles that worked.
///
/// # Errors
/// A table-writing error.
pub fn run_mi_sweep(
    reqs: &[MiRequest],
    out_dir: &Path,
    log: &mut dyn FnMut(&MiResult),
) -> Result<MiSweepReport, MiError> {
    let mut results = Vec::with_capacity(reqs.len());
    let mut failures = Vec::new();
    for r in reqs {
        match compute(r) {
            Ok(res) => {
                log(&res);
                results.push(res);
            }
            Err(e) => {
                let what = match &r.source {
                    MiSource::Corpus(c) => {
                        format!("{c} {}", r.granularity.as_deref().unwrap_or(""))
                    }
                    MiSource::Input(p) => p.display().to_string(),
                    MiSource::Task { task, .. } => {
                        r.label.clone().unwrap_or_else(|| format!("task:{task}"))
                    }
                };
                failures.push((what, e.to_string()));
            }
        }
    }
    fill_collapse(&mut results);
    write_batch(&out_dir.join("mi.parquet"), &mi_table(&results))?;
    write_batch(
        &out_dir.join("mi_summary.parquet"),
        &summary_table(&results),
    )?;
    Ok(MiSweepReport { results, failures })
}

/// `lab mi`: compute one profile; with `parquet_dir`, write its `mi` and `mi_summary` tables
/// there. Returns `(summary, output)`: the summary line(s) for stderr, and for stdout the CSV
/// profile (no `parquet_dir`) or where the tables went.
///
/// # Errors
/// See [`compute`]; a table that cannot be written.
pub fn profile_command(
    req: &MiRequest,
    parquet_dir: Option<&Path>,
) -> Result<(String, String), MiError> {
    // A corpus or a file can take tens of seconds (the shuffled baselines): say what starts,
    // once its tokens are ready (after every input was checked). Tasks are small.
    let is_task = matches!(req.source, MiSource::Task { .. });
    let r = compute_with(req, &mut |name, g, n| {
        if !is_task {
            eprintln!(
                "mi: {name} at {g}: {n} tokens; lags 1..={} against {} shuffled baselines …",
                req.config.max_lag, req.config.n_shuffles
            );
        }
    })?;
    let summary = summary_lines(std::slice::from_ref(&r));
    let output = match parquet_dir {
        None => csv(&r),
        Some(dir) => {
            let rs = [r];
            write_batch(&dir.join("mi.parquet"), &mi_table(&rs))?;
            write_batch(&dir.join("mi_summary.parquet"), &summary_table(&rs))?;
            format!("tables in {}\n", dir.display())
        }
    };
    Ok((summary, output))
}

/// `lab sweep NAME` for an MI sweep file (`kind = "mi"`): every profile of `preset` (default:
/// the file's), a progress line per profile to stderr, then the tables in `out` (default
/// `results/<name>`). Returns the text to print (summary, failures, counts) and whether every
/// profile worked.
///
/// # Errors
/// An invalid sweep file or preset; a table that cannot be written.
pub fn run_mi_sweep_file(
    path: &Path,
    preset: Option<String>,
    out: Option<PathBuf>,
) -> Result<(String, bool), MiError> {
    let spec = MiSweep::load(path)?;
    let preset = preset.unwrap_or_else(|| spec.default_preset.clone());
    let reqs = spec.requests(&preset, &tasks::text::default_data_dir())?;
    let out_dir = out.unwrap_or_else(|| PathBuf::from("results").join(&spec.name));
    let t0 = std::time::Instant::now();
    let report = run_mi_sweep(&reqs, &out_dir, &mut |r| {
        eprintln!(
            "{} {}: {} tokens, W = {}, {:.1} s",
            r.corpus,
            r.granularity,
            r.n_tokens,
            r.profile
                .dep_width
                .map_or("none (no significant lag)".to_string(), |w| w.to_string()),
            r.wall_time_s
        )
    })?;
    let mut text = format!("\n{}\n", summary_lines(&report.results));
    for (what, e) in &report.failures {
        text.push_str(&format!("failed: {what}: {e}\n"));
    }
    text.push_str(&format!(
        "{} profiles ({} failed) in {:.1} s; tables in {}",
        report.results.len(),
        report.failures.len(),
        t0.elapsed().as_secs_f64(),
        out_dir.display()
    ));
    Ok((text, report.failures.is_empty()))
}

/// `lab recommend`: [`recommend`] with the `runs.parquet` tables found one folder below
/// `results` (each sweep's), after checking `head_dim` (even, ≥ 4) and `factor` (finite, ≥ 1).
///
/// # Errors
/// [`MiError::Input`] naming the out-of-range option; see [`recommend`].
pub fn recommend_in(
    data_dir: &Path,
    corpus: &str,
    granularities: &[String],
    head_dim: usize,
    factor: f64,
    results: &Path,
) -> Result<Vec<Recommendation>, MiError> {
    if head_dim < 4 || head_dim % 2 != 0 {
        return Err(MiError::Input(format!(
            "--head-dim = {head_dim} is out of range: must be an even number ≥ 4"
        )));
    }
    if !(factor >= 1.0 && factor.is_finite()) {
        return Err(MiError::Input(format!(
            "--factor = {factor} is out of range: must be a finite number ≥ 1"
        )));
    }
    let tables: Vec<PathBuf> = std::fs::read_dir(results)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path().join("runs.parquet"))
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    recommend(data_dir, corpus, granularities, head_dim, factor, &tables)
}

// ---- width of a corpus for training runs, and the law's recommendation ----

/// Largest lag used when measuring a corpus's width for [`corpus_dep_width`] and
/// [`recommend`].
pub const WIDTH_MAX_LAG: usize = 1024;

/// The dependency width `W` (tokens) of a corpus at a granularity, from its MI profile with
/// `max_lag` lags (Miller–Madow, seed 0). Cached as JSON in
/// `<data>/mi-cache/<corpus>-<granularity>-R<max_lag>.json`, since every training run asks.
///
/// # Errors
/// [`MiError`] if the corpus is missing or the profile cannot be computed.
pub fn corpus_width(
    data_dir: &Path,
    corpus: &str,
    granularity: &str,
    max_lag: usize,
) -> Result<MiResult, MiError> {
    corpus_width_with(data_dir, corpus, granularity, max_lag, &mut |_, _, _| {})
}

/// [`corpus_width`], calling `ready(corpus, granularity, tokens)` when a profile that is not
/// cached starts to be measured (its tokens built, every input checked); not called on a
/// cache hit.
///
/// # Errors
/// As [`corpus_width`].
pub fn corpus_width_with(
    data_dir: &Path,
    corpus: &str,
    granularity: &str,
    max_lag: usize,
    ready: &mut dyn FnMut(&str, &str, usize),
) -> Result<MiResult, MiError> {
    let cache = data_dir
        .join("mi-cache")
        .join(format!("{corpus}-{granularity}-R{max_lag}.json"));
    if let Ok(t) = std::fs::read_to_string(&cache)
        && let Ok(p) = serde_json::from_str::<CachedProfile>(&t)
    {
        return Ok(p.into_result());
    }
    let r = compute_with(
        &MiRequest {
            source: MiSource::Corpus(corpus.to_string()),
            granularity: Some(granularity.to_string()),
            config: MiConfig {
                max_lag,
                ..MiConfig::default()
            },
            data_dir: data_dir.to_path_buf(),
            label: None,
        },
        ready,
    )?;
    if let Some(dir) = cache.parent() {
        let _ = std::fs::create_dir_all(dir);
        let tmp = cache.with_extension(format!("tmp-{}", std::process::id()));
        if std::fs::write(
            &tmp,
            serde_json::to_string(&CachedProfile::from(&r)).unwrap_or_default(),
        )
        .is_ok()
        {
            let _ = std::fs::rename(&tmp, &cache);
        }
    }
    Ok(r)
}

#[derive(serde::Serialize, Deserialize)]
struct CachedProfile {
    corpus: String,
    granularity: String,
    vocab_size: usize,
    n_tokens: usize,
    chars_per_token: f64,
    profile: MiProfile,
}

impl CachedProfile {
    fn from(r: &MiResult) -> Self {
        CachedProfile {
            corpus: r.corpus.clone(),
            granularity: r.granularity.clone(),
            vocab_size: r.vocab_size,
            n_tokens: r.n_tokens,
            chars_per_token: r.chars_per_token,
            profile: r.profile.clone(),
        }
    }
    fn into_result(self) -> MiResult {
        MiResult {
            corpus: self.corpus,
            granularity: self.granularity,
            vocab_size: self.vocab_size,
            n_tokens: self.n_tokens,
            chars_per_token: self.chars_per_token,
            profile: self.profile,
            collapse_error: None,
            wall_time_s: 0.0,
        }
    }
}

/// `dep_width` of a corpus run: `W` of its corpus and granularity measured with
/// `min(seq_len, WIDTH_MAX_LAG)` lags (`None` when nothing is significant or the data is missing).
pub fn corpus_dep_width(corpus: &str, granularity: &str, seq_len: usize) -> Option<usize> {
    let r = corpus_width(
        &tasks::text::default_data_dir(),
        corpus,
        granularity,
        seq_len.clamp(1, WIDTH_MAX_LAG),
    )
    .ok()?;
    r.profile.dep_width
}

/// The law's recommendation for one corpus at one granularity (`lab recommend`).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Recommendation {
    /// Corpus.
    pub corpus: String,
    /// Granularity.
    pub granularity: String,
    /// `W` from the MI profile, tokens (`None`: nothing significant).
    pub dep_width: Option<usize>,
    /// Largest significant lag, tokens.
    pub max_significant_lag: Option<usize>,
    /// `power`, `exp` or `none`.
    pub decay_model: String,
    /// Collapse error across the corpus's granularities (`None` with one granularity).
    pub collapse_error: Option<f64>,
    /// The law's frequency `θ* = π / W`, radians per token.
    pub theta_star: Option<f64>,
    /// Smallest RoPE base whose lowest frequency `base^(−(d−2)/d)` is at most `π/W` (the whole
    /// rotary range can resolve the width): `(W/π)^(d/(d−2))`.
    pub rope_base_min: Option<f64>,
    /// RoPE base whose log-mean frequency (θ_eff of a uniform spectrum,
    /// `base^(−(d−2)/(2d))`) equals `π/W`: `(W/π)^(2d/(d−2))`.
    pub rope_base_centred: Option<f64>,
    /// Position-interpolation factor the law recommends for a context `s` times the trained one:
    /// `s` when the data is self-similar (power-law decay and collapse error below
    /// [`SELF_SIMILAR_MAX_COLLAPSE`]: W grows with the context), else 1 (W is fixed, keep θ).
    pub pi_factor: f64,
    /// Trained runs on this corpus and granularity: (encoding, seq_len, θ_eff), from
    /// `runs.parquet` files under the results folder.
    pub trained: Vec<(String, i64, f64)>,
}

/// Collapse error below which a corpus counts as self-similar (natural-log units of MI).
pub const SELF_SIMILAR_MAX_COLLAPSE: f64 = 0.25;

/// Build the recommendation for `corpus` at each granularity in `granularities` (all of the
/// corpus's when empty), for rotary head dimension `head_dim` and a length factor `factor`,
/// reading trained runs from `runs_tables` (`runs.parquet` files).
///
/// # Errors
/// [`MiError`] if the corpus is missing or a granularity is not offered.
pub fn recommend(
    data_dir: &Path,
    corpus: &str,
    granularities: &[String],
    head_dim: usize,
    factor: f64,
    runs_tables: &[PathBuf],
) -> Result<Vec<Recommendation>, MiError> {
    let spec = tasks::corpus::spec(corpus)?;
    let grans: Vec<String> = if granularities.is_empty() {
        spec.granularities.iter().map(|g| g.to_string()).collect()
    } else {
        granularities.to_vec()
    };
    let mut results = Vec::with_capacity(grans.len());
    for (i, g) in grans.iter().enumerate() {
        // A profile not yet cached takes seconds to minutes (BPE training, shuffles): a line
        // when it starts (its inputs checked) and one when it is done.
        let t0 = std::time::Instant::now();
        let mut started = false;
        let n = grans.len();
        let cache_dir = data_dir.join("mi-cache");
        results.push(corpus_width_with(
            data_dir,
            corpus,
            g,
            WIDTH_MAX_LAG,
            &mut |c, g, tokens| {
                started = true;
                eprintln!(
                    "recommend: MI profile of {c} at {g} ({}/{n}, {tokens} tokens; cached in {} afterwards) …",
                    i + 1,
                    cache_dir.display()
                );
            },
        )?);
        if started {
            eprintln!(
                "recommend: {corpus} at {g} done in {:.1} s",
                t0.elapsed().as_secs_f64()
            );
        }
    }
    fill_collapse(&mut results);
    let mut trained: Vec<(String, String, i64, f64)> = Vec::new();
    for t in runs_tables {
        let Ok((_, batches)) = crate::store::read_parquet(t) else {
            continue;
        };
        use crate::store::column::{floats, ints, strings};
        for b in &batches {
            let (c, g, e) = (
                strings(b, "corpus"),
                strings(b, "granularity"),
                strings(b, "encoding"),
            );
            let (l, f, st) = (
                ints(b, "seq_len"),
                floats(b, "effective_freq"),
                strings(b, "status"),
            );
            for i in 0..b.num_rows() {
                if c[i].as_deref() == Some(corpus)
                    && st[i].as_deref() == Some("done")
                    && let (Some(g), Some(e), Some(l), Some(f)) = (&g[i], &e[i], l[i], f[i])
                {
                    trained.push((g.clone(), e.clone(), l, f));
                }
            }
        }
    }
    let d = head_dim as f64;
    Ok(results
        .iter()
        .map(|r| {
            let w = r.profile.dep_width;
            let ratio = w.map(|w| w as f64 / std::f64::consts::PI);
            let self_similar = r.profile.decay.model == tasks::mi::DecayModel::Power
                && r.collapse_error
                    .is_some_and(|e| e < SELF_SIMILAR_MAX_COLLAPSE);
            Recommendation {
                corpus: corpus.to_string(),
                granularity: r.granularity.clone(),
                dep_width: w,
                max_significant_lag: r.profile.max_significant_lag,
                decay_model: r.profile.decay.model.name().to_string(),
                collapse_error: r.collapse_error,
                theta_star: w.map(|w| std::f64::consts::PI / w as f64),
                rope_base_min: ratio.map(|x| x.max(1.0).powf(d / (d - 2.0))),
                rope_base_centred: ratio.map(|x| x.max(1.0).powf(2.0 * d / (d - 2.0))),
                pi_factor: if self_similar { factor } else { 1.0 },
                trained: trained
                    .iter()
                    .filter(|t| t.0 == r.granularity)
                    .map(|t| (t.1.clone(), t.2, t.3))
                    .collect(),
            }
        })
        .collect())
}

/// The recommendation as a text table.
pub fn recommend_lines(recs: &[Recommendation], head_dim: usize, factor: f64) -> String {
    let f = |v: Option<f64>, p: usize| v.map(|x| format!("{x:.p$}")).unwrap_or_else(|| "-".into());
    let mut out = format!(
        "{:<10} {:<10} {:>6} {:>7} {:>6} {:>8} {:>8} {:>10} {:>10} {:>5}  trained θ_eff (encoding@L)\n",
        "corpus",
        "gran.",
        "W",
        "maxsig",
        "decay",
        "collapse",
        "θ*=π/W",
        "base_min",
        "base_ctr",
        "PI"
    );
    for r in recs {
        let trained: Vec<String> = r
            .trained
            .iter()
            .map(|(e, l, t)| format!("{e}@{l}: {t:.4}"))
            .collect();
        out.push_str(&format!(
            "{:<10} {:<10} {:>6} {:>7} {:>6} {:>8} {:>8} {:>10} {:>10} {:>5}  {}\n",
            r.corpus,
            r.granularity,
            r.dep_width
                .map(|w| w.to_string())
                .unwrap_or_else(|| "-".into()),
            r.max_significant_lag
                .map(|w| w.to_string())
                .unwrap_or_else(|| "-".into()),
            r.decay_model,
            f(r.collapse_error, 3),
            f(r.theta_star, 4),
            f(r.rope_base_min, 1),
            f(r.rope_base_centred, 1),
            format!("{:.0}", r.pi_factor),
            if trained.is_empty() {
                "-".to_string()
            } else {
                trained.join(", ")
            }
        ));
    }
    out.push_str(&format!(
        "(head_dim {head_dim}; base_min: smallest RoPE base whose lowest frequency resolves W; base_ctr: base whose \
         log-mean frequency is π/W; PI: interpolation factor for a {factor}× longer context — {factor} if the data is \
         self-similar, else 1)\n"
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_profile_and_tables() {
        let req = MiRequest {
            source: MiSource::Task {
                task: "block".into(),
                params: vec![
                    "variant=recall".into(),
                    "block_len=6".into(),
                    "seq_len=32".into(),
                ],
                n_examples: 1500,
            },
            granularity: None,
            config: MiConfig {
                max_lag: 16,
                ..MiConfig::default()
            },
            data_dir: PathBuf::from("data"),
            label: None,
        };
        let r = compute(&req).unwrap();
        assert_eq!(r.corpus, "task:block");
        assert_eq!(r.profile.dep_width, Some(6));
        assert_eq!(r.profile.max_significant_lag, Some(6));
        let t = mi_table(std::slice::from_ref(&r));
        assert_eq!(t.num_rows(), 16);
        for c in [
            "schema_version",
            "corpus",
            "granularity",
            "vocab_size",
            "n_tokens",
            "chars_per_token",
            "lag",
            "lag_chars",
            "mutual_info",
            "mi_shuffle_mean",
            "mi_shuffle_hi",
            "significant",
            "estimator",
        ] {
            assert!(t.schema().field_with_name(c).is_ok(), "{c}");
        }
        let s = summary_table(std::slice::from_ref(&r));
        assert_eq!(s.num_rows(), 1);
        let csv = csv(&r);
        assert!(csv.starts_with("lag,lag_chars,mutual_info,"));
        assert_eq!(csv.lines().count(), 17);
    }

    #[test]
    fn task_rejects_text_granularity() {
        let req = MiRequest {
            source: MiSource::Task {
                task: "block".into(),
                params: vec![],
                n_examples: 10,
            },
            granularity: Some("word".into()),
            config: MiConfig::default(),
            data_dir: PathBuf::from("data"),
            label: None,
        };
        assert_eq!(
            compute(&req).unwrap_err().to_string(),
            "granularity word is not offered for a task: tasks have `token` only"
        );
    }

    #[test]
    fn input_file_profile() {
        let dir = std::env::temp_dir().join(format!("lab-mi-input-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("abab.txt");
        std::fs::write(&f, "ab".repeat(500)).unwrap();
        let r = compute(&MiRequest {
            source: MiSource::Input(f),
            granularity: Some("char".into()),
            config: MiConfig {
                max_lag: 8,
                ..MiConfig::default()
            },
            data_dir: dir.clone(),
            label: None,
        })
        .unwrap();
        assert_eq!(r.corpus, "abab.txt");
        assert!((r.profile.plug_in[1] - std::f64::consts::LN_2).abs() < 1e-12);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn sweep_file_parses_and_rejects_bad_fields() {
        let dir = std::env::temp_dir().join(format!("lab-mi-sweep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("m.toml");
        std::fs::write(
            &p,
            "kind = \"mi\"\n[base]\nmax_lag = 32\n[[profiles]]\ncorpus = \"shakespeare\"\ngranularities = [\"char\", \"word\"]\n[[profiles]]\ntask = \"block\"\nmax_lag = 8\n[presets.quick]\n",
        )
        .unwrap();
        assert!(is_mi_sweep(&p));
        let s = MiSweep::load(&p).unwrap();
        let reqs = s.requests("quick", Path::new("data")).unwrap();
        assert_eq!(reqs.len(), 3);
        assert_eq!(reqs[0].config.max_lag, 32);
        assert_eq!(reqs[2].config.max_lag, 8);
        std::fs::write(
            &p,
            "kind = \"mi\"\n[[profiles]]\ncorpus = \"lorem\"\n[presets.quick]\n",
        )
        .unwrap();
        let e = MiSweep::load(&p)
            .unwrap()
            .requests("quick", Path::new("data"))
            .unwrap_err();
        assert!(e.to_string().contains("corpus `lorem` is unknown"), "{e}");
        std::fs::write(&p, "kind = \"mi\"\n[base]\nmax_lags = 3\n").unwrap();
        let e = MiSweep::load(&p).unwrap_err().to_string();
        assert!(e.contains("max_lags"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

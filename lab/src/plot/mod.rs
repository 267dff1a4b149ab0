//! Figures of a sweep's results (`lab plot SWEEP`): one figure per claim, each as PNG and SVG,
//! drawn with plotters from the sweep's Parquet tables (schemas in `results/README.md`).
//!
//! | sweep | figure | what it shows |
//! |---|---|---|
//! | `block-width` | `spectrum-heatmap` | energy share per rotary frequency × block width, per variant and layer, with π/B |
//! | `block-width` | `theta-eff-vs-width` | θ_eff vs W (log-log) per pooling (positional layer, each layer), fitted c·W^(−β) with its bootstrap band, π/W |
//! | `base-vs-width` | `theta-eff-vs-width` | θ_eff (positional layer) vs W per variant × rope_base × training length, fitted c·W^(−β), π/W |
//! | `block-width` | `ablation` | accuracy unablated / with the π/B band / with a far band at θ = 0, per B (when the sweep ablated) |
//! | `indirect-indexing` | `accuracy-by-encoding` | final-token accuracy per encoding, seeds as dots, chance |
//! | `indirect-indexing` | `accuracy-curves` | held-out accuracy vs training step per encoding |
//! | `indirect-indexing` | `accuracy-vs-examples` | held-out accuracy vs examples seen (log), a panel per task setting |
//! | `pi-self-similarity` | `pi-accuracy` | accuracy at s × L per scaling, dilated vs fixed tasks (grouped bars) |
//! | `length-extrapolation` | `nll-vs-length` | value NLL and needle accuracy vs evaluation length per encoding/scaling |
//! | `igsm-ops` | `igsm-ops` | answer accuracy and θ_eff vs number of operations (each run's own `ops` and the other sizes it was evaluated on at 1×) |
//! | `igsm-ops` | `igsm-answer-curves` | answer accuracy against training step per `ops` (runs with `answer_curve > 0`; one model's several sizes with `answer_curve_min_ops`) |
//! | `real-sequences` | `real-sequences-nll` | held-out NLL vs evaluation length per corpus, per encoding and RoPE scaling |
//! | `mi-profiles` | `mi-profiles`, `mi-tasks` | corpora: MI vs lag per granularity, raw and rescaled to characters; synthetic tasks: MI vs lag |
//!
//! The series are computed in [`data`] (tested on hand-made tables); [`draw`] draws them.
//! Every file is drawn under a temporary name and renamed into place.

pub mod data;
pub mod draw;
mod font;

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::results::ResultsError;
use data::Table;
use draw::{
    BarsPlot, Figure, GroupAxis, GroupedBarsPlot, LawPlot, LinePanel, LinesPlot, MiPlot,
    SpectrumFigure,
};

pub use font::{FONT_ENV, find_font, register as register_font};

/// Errors of `lab plot`.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// Reading a table.
    #[error(transparent)]
    Results(#[from] ResultsError),
    /// A table the figure needs is not there.
    #[error("{0} not found: run the sweep first (`lab sweep NAME`), or pass --results DIR")]
    MissingTable(PathBuf),
    /// A column the figure needs is not in the table.
    #[error("{table} has no column `{column}` (written by an older lab version?)")]
    MissingColumn {
        /// The table.
        table: String,
        /// The column.
        column: String,
    },
    /// Nothing to draw.
    #[error("nothing to plot for {figure}: {why}")]
    Empty {
        /// The figure.
        figure: String,
        /// Why.
        why: String,
    },
    /// No sweep of that name has figures.
    #[error("no figures for sweep `{name}`; sweeps with figures: {known}")]
    UnknownSweep {
        /// The name given.
        name: String,
        /// The names with figures.
        known: String,
    },
    /// The results folder holds another sweep's runs (its `runs` table says which).
    #[error(
        "{results} holds runs of sweep {found}, not {wanted}: name sweep {found} instead, or pass the results folder of sweep {wanted} with --results (default <lab root>/results/{wanted})"
    )]
    WrongSweep {
        /// The folder.
        results: String,
        /// The sweep asked for.
        wanted: String,
        /// The sweep(s) its runs belong to.
        found: String,
    },
    /// No font for text.
    #[error(
        "no TrueType font found for figure text: install DejaVu (Debian: apt-get install fonts-dejavu-core) or set {FONT_ENV}=/path/to/font.ttf"
    )]
    NoFont,
    /// A font file that cannot be read or parsed.
    #[error("cannot use font {path}: {why}")]
    BadFont {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// Drawing or writing a figure failed.
    #[error("cannot draw {path}: {message}")]
    Draw {
        /// The figure file.
        path: PathBuf,
        /// The cause.
        message: String,
    },
    /// Filesystem error.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// The sweeps `lab plot` knows, with the figures (file stems) each gets.
pub const SWEEP_FIGURES: &[(&str, &[&str])] = &[
    (
        "block-width",
        &["spectrum-heatmap", "theta-eff-vs-width", "ablation"],
    ),
    (
        "indirect-indexing",
        &[
            "accuracy-by-encoding",
            "accuracy-curves",
            "accuracy-vs-examples",
            "attention",
        ],
    ),
    ("base-vs-width", &["theta-eff-vs-width"]),
    ("pi-self-similarity", &["pi-accuracy"]),
    ("length-extrapolation", &["nll-vs-length"]),
    ("igsm-ops", &["igsm-ops"]),
    ("mi-profiles", &["mi-profiles", "mi-tasks"]),
    ("real-sequences", &["real-sequences-nll"]),
];

/// Figures drawn only when the results hold their data (`lab report` inlines them when they are
/// there): iGSM answer curves need runs with `answer_curve > 0`.
pub const OPTIONAL_FIGURES: &[(&str, &[&str])] = &[("igsm-ops", &["igsm-answer-curves"])];

/// The figure any sweep gets when its plan selects on validation (docs/analysis-rules.md R58):
/// the validation metric against the selection's axis, per encoding, one panel per setting.
pub const SELECTION_FIGURE: &str = "selection";

/// The caption of figure `stem` of sweep `sweep` (what it shows and how to read it; the table in
/// the module docs), empty for an unknown pair.
pub fn figure_caption(sweep: &str, stem: &str) -> &'static str {
    match (sweep, stem) {
        ("block-width", "spectrum-heatmap") => {
            "Share of the attention logits' energy on each rotary frequency (rows, radians per token) at each block width B (columns), per variant and layer, at the final evaluation, mean over seeds; the marks show π/B, where the law puts the energy."
        }
        ("block-width", "theta-eff-vs-width") => {
            "Effective frequency θ_eff against the dependency width W (log-log), per pooling (the positional layer of docs/analysis-rules.md R2, each layer), with the fitted c·W^(−β), its bootstrap band over seeds, and the law's π/W."
        }
        ("block-width", "ablation") => {
            "The causal check: held-out accuracy unablated, with the two rotary pairs around π/B set to θ = 0 (law band), and with an equally wide band far from it (far band), per B; the law predicts the law band costs far more."
        }
        ("base-vs-width", "theta-eff-vs-width") => {
            "θ_eff of the positional layer against W per variant × rope_base × training length, with fitted c·W^(−β) and π/W: whether the trained frequencies follow the data's width or the grid the base sets."
        }
        ("indirect-indexing", "accuracy-by-encoding") => {
            "Final-token accuracy of indirect indexing per encoding (bars: mean; dots: seeds) against chance (1/52); the PoPE paper reports RoPE 11.16 %, PoPE 94.82 %."
        }
        ("indirect-indexing", "accuracy-curves") => {
            "Held-out accuracy against training step per encoding (seeds as lines): whether and when each learns to match content and then shift by position."
        }
        ("indirect-indexing", "accuracy-vs-examples") => {
            "Held-out accuracy against the training examples seen (log axis), one panel per task setting (letters, shift range), per encoding: where, if anywhere, PoPE pulls away from RoPE."
        }
        ("indirect-indexing", "attention") => {
            "What vs where: the final prompt token's attention, per layer and head, on the query letter's place in the string (a content match), on the answer letter (the shift applied), on the query token and on the other letters; a model that solves the task has a head on the answer letter."
        }
        ("pi-self-similarity", "pi-accuracy") => {
            "Accuracy at s × the training length per RoPE scaling (none, PI, NTK, YaRN), on the dilated (self-similar) task and on the fixed task: the paper's claim is that PI recovers the self-similar task and fails where the dependency width does not scale."
        }
        ("length-extrapolation", "nll-vs-length") => {
            "Value NLL (nats) and needle accuracy against the evaluation length per encoding and RoPE scaling, trained at 1×: TAPA's claim is stable loss far past the training length."
        }
        ("igsm-ops", "igsm-ops") => {
            "iGSM: answer accuracy (greedy decoding) and θ_eff against the number of operations per problem."
        }
        ("igsm-ops", "igsm-answer-curves") => {
            "iGSM: greedy answers on held-out problems against the training step, one curve per number of operations (with answer_curve_min_ops, the same model's answers at each size): which sizes are learned, and in which order."
        }
        (_, "selection") => {
            "Selection on validation: the validation loss (or accuracy) of every run against the value of the axis chosen on (log axis), one curve per encoding (band: min–max over seeds), one panel per setting; each seed's best point is its selected run, whose test numbers the tables report (docs/analysis-rules.md R58)."
        }
        ("real-sequences", "real-sequences-nll") => {
            "Held-out NLL against evaluation length per corpus, per encoding and RoPE scaling, trained at 1×."
        }
        ("mi-profiles", "mi-profiles") => {
            "Mutual information I(r) against lag r per corpus and granularity, raw and with lags rescaled to characters: how far back the data's dependencies reach."
        }
        ("mi-profiles", "mi-tasks") => {
            "Mutual information against lag for the synthetic tasks, whose dependency width is known by construction."
        }
        _ => "",
    }
}

/// Refuse a results folder whose runs all belong to *other* sweeps with figures (e.g.
/// `lab plot igsm-ops --results results/block-width`). Runs of a sweep file without figures of
/// its own (a new experiment drawn with an existing sweep's figures) and folders without a
/// `runs` table (MI sweeps) pass.
/// Refuse a results folder whose runs belong to another sweep with figures than `sweep` (a
/// folder of a sweep file without figures, or of runs of several sweeps, passes). `lab plot` and
/// `lab report` check it first.
///
/// # Errors
/// [`PlotError::WrongSweep`], or a `runs` table that cannot be read.
pub fn check_sweep(sweep: &str, results: &Path) -> Result<(), PlotError> {
    let path = results.join("runs.parquet");
    if !path.is_file() {
        return Ok(());
    }
    let runs = Table::read(&path)?;
    if !runs.has("sweep") {
        return Ok(());
    }
    let names: std::collections::BTreeSet<String> =
        runs.strs("sweep")?.into_iter().flatten().collect();
    let known = |n: &String| SWEEP_FIGURES.iter().any(|(k, _)| k == n);
    if !names.is_empty() && !names.contains(sweep) && names.iter().all(known) {
        return Err(PlotError::WrongSweep {
            results: results.display().to_string(),
            wanted: sweep.to_string(),
            found: names.into_iter().collect::<Vec<_>>().join(", "),
        });
    }
    Ok(())
}

/// Chance accuracy of the indirect-indexing answer: one of 52 letters (sweeps/indirect-indexing.toml).
pub const INDIRECT_CHANCE: f64 = 1.0 / 52.0;

/// Draw every figure of sweep `sweep` from the tables in `results` into `out` (created if
/// needed), each as `<figure>.png` and `<figure>.svg`. Returns the files written, in order.
///
/// Errors: an unknown sweep name, a missing table or column, an empty table, no font.
pub fn plot_sweep(sweep: &str, results: &Path, out: &Path) -> Result<Vec<PathBuf>, PlotError> {
    // On an error, leave no folder behind that this call created (`out`, or the first of its
    // parents that did not exist: `--results MISSING` makes `MISSING/figures`).
    let created = out
        .ancestors()
        .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
        .last()
        .map(Path::to_path_buf);
    let written = draw_sweep(sweep, results, out);
    if let (Err(_), Some(c)) = (&written, &created) {
        let _ = std::fs::remove_dir_all(c);
    }
    written
}

fn draw_sweep(sweep: &str, results: &Path, out: &Path) -> Result<Vec<PathBuf>, PlotError> {
    let known = SWEEP_FIGURES.iter().any(|(n, _)| *n == sweep);
    if !known {
        return Err(PlotError::UnknownSweep {
            name: sweep.to_string(),
            known: SWEEP_FIGURES
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    // The run table's rows that a selection on validation left out are not drawn (R58).
    let table = |name: &str| {
        let path = results.join(format!("{name}.parquet"));
        if name == "runs" {
            Table::read_selected(&path)
        } else {
            Table::read(&path)
        }
    };
    check_sweep(sweep, results)?;
    font::register()?;
    std::fs::create_dir_all(out).map_err(|source| PlotError::Io {
        path: out.to_path_buf(),
        source,
    })?;
    let mut written = selection_figure(results, out)?;
    let selecting = !written.is_empty();
    match sweep {
        "block-width" => {
            let runs = table("runs")?;
            let spectrum = table("spectrum")?;
            let maps = data::spectrum_heatmaps(&runs, &spectrum, "rope")?;
            if maps.is_empty() {
                return Err(empty("spectrum-heatmap", "no finished RoPE run"));
            }
            written.extend(save(
                &SpectrumFigure {
                    maps,
                    encoding: "rope".into(),
                },
                out,
                "spectrum-heatmap",
            )?);
            let fit = match table("fit") {
                Ok(t) => Some(t),
                Err(PlotError::MissingTable(_)) => None,
                Err(e) => return Err(e),
            };
            let layers = match table("layers") {
                Ok(t) => Some(t),
                Err(PlotError::MissingTable(_)) => None,
                Err(e) => return Err(e),
            };
            let fig = data::law_figure(&runs, layers.as_ref(), fit.as_ref())?;
            if fig.groups.is_empty() {
                return Err(empty(
                    "theta-eff-vs-width",
                    "no rotary group with two or more widths",
                ));
            }
            written.extend(save(&LawPlot { fig }, out, "theta-eff-vs-width")?);
            // The causal check, when the sweep's `[[evals]]` ablated bands (results written
            // before 2026-12-01 have no ablation: the figure is skipped).
            let panels = match table("evals") {
                Ok(t) => data::ablation_panels(&t)?,
                Err(PlotError::MissingTable(_)) => Vec::new(),
                Err(e) => return Err(e),
            };
            if !panels.is_empty() {
                written.extend(save(
                    &GroupedBarsPlot {
                        title: "Causal check: accuracy with the rotary pairs around π/B, or far from it, set to θ = 0".into(),
                        panels,
                        groups: GroupAxis::BlockWidth,
                    },
                    out,
                    "ablation",
                )?);
            }
        }
        "base-vs-width" => {
            // The law figure with the positional layer only (docs/analysis-rules.md R2; results
            // without per-layer tables: the pooled θ_eff), one fitted line per variant ×
            // rope_base × training length, as the sweep's fit table groups them.
            let runs = table("runs")?;
            let fit = table("fit").ok();
            let layers = table("layers").ok();
            let mut fig = data::law_figure(&runs, layers.as_ref(), fit.as_ref())?;
            if fig.groups.iter().any(|g| g.group.ends_with("· positional")) {
                fig.groups.retain(|g| g.group.ends_with("· positional"));
            }
            fig.control.clear();
            if fig.groups.is_empty() {
                return Err(empty(
                    "theta-eff-vs-width",
                    "no rotary group with two or more widths",
                ));
            }
            written.extend(save(&LawPlot { fig }, out, "theta-eff-vs-width")?);
        }
        "indirect-indexing" => {
            let runs = table("runs")?;
            let bars = data::accuracy_by_encoding(&runs)?;
            if bars.is_empty() {
                return Err(empty("accuracy-by-encoding", "no finished run"));
            }
            written.extend(save(
                &BarsPlot {
                    title: "Indirect indexing: final-token accuracy per encoding".into(),
                    y_desc: "held-out accuracy (answer token)".into(),
                    bars,
                    reference: Some((INDIRECT_CHANCE, "chance (1/52)".into())),
                },
                out,
                "accuracy-by-encoding",
            )?);
            let curves = data::eval_accuracy_curves(&runs, &table("curves")?)?;
            written.extend(save(
                &LinesPlot {
                    title: "Indirect indexing: learning curves".into(),
                    panels: vec![LinePanel {
                        title: String::new(),
                        x_desc: "training step".into(),
                        y_desc: "held-out accuracy (answer token)".into(),
                        curves,
                        log2_x: false,
                        percent_y: true,
                        vlines: vec![],
                        legend: Some(SeriesLabelPosition::UpperLeft),
                    }],
                    note: "line: mean over seeds; band: min–max over seeds".into(),
                },
                out,
                "accuracy-curves",
            )?);
            let settings = data::accuracy_vs_examples(&runs, &table("curves")?)?;
            if !settings.is_empty() {
                written.extend(save(
                    &LinesPlot {
                        title: "Indirect indexing: accuracy against training examples seen".into(),
                        panels: settings
                            .into_iter()
                            .enumerate()
                            .map(|(i, s)| LinePanel {
                                title: s.setting,
                                x_desc: "training examples seen (thousands)".into(),
                                y_desc: "held-out accuracy (answer token)".into(),
                                curves: s.curves,
                                log2_x: true,
                                percent_y: true,
                                vlines: vec![],
                                legend: (i == 0).then_some(SeriesLabelPosition::UpperLeft),
                            })
                            .collect(),
                        note: "one panel per task setting; line: mean over seeds; band: min–max over seeds; log axis".into(),
                    },
                    out,
                    "accuracy-vs-examples",
                )?);
            }
            // Runs of lab versions before 2026-12-02 have no attention table: two figures then.
            if let Ok(attention) = table("attention") {
                let panels = data::attention_panels(&attention, &runs)?;
                if !panels.is_empty() {
                    written.extend(save(
                        &GroupedBarsPlot {
                            title: "Indirect indexing: where the final token looks".into(),
                            panels,
                            groups: GroupAxis::LayerHead,
                        },
                        out,
                        "attention",
                    )?);
                }
            }
        }
        "pi-self-similarity" => {
            let panels = data::pi_panels(&table("evals")?)?;
            if panels.is_empty() {
                return Err(empty("pi-accuracy", "evals.parquet has no rows"));
            }
            written.extend(save(
                &GroupedBarsPlot {
                    title: "Position interpolation on self-similar (dilated) and fixed-width tasks"
                        .into(),
                    panels,
                    groups: GroupAxis::LengthRatio,
                },
                out,
                "pi-accuracy",
            )?);
        }
        "length-extrapolation" => {
            let evals = table("evals")?;
            let (nll, trains) = data::length_curves(&evals, "loss")?;
            let (acc, _) = data::length_curves(&evals, "accuracy")?;
            if nll.is_empty() {
                return Err(empty("nll-vs-length", "evals.parquet has no rows"));
            }
            let vlines: Vec<(f64, String)> = trains
                .iter()
                .map(|t| (*t as f64, format!("training length {t}")))
                .collect();
            written.extend(save(
                &LinesPlot {
                    title: "Length extrapolation on needle retrieval".into(),
                    panels: vec![
                        LinePanel {
                            title: "negative log-likelihood of the value".into(),
                            x_desc: "evaluation context length (tokens)".into(),
                            y_desc: "NLL (nats per value token)".into(),
                            curves: nll,
                            log2_x: true,
                            percent_y: false,
                            vlines: vlines.clone(),
                            legend: Some(SeriesLabelPosition::UpperLeft),
                        },
                        LinePanel {
                            title: "needle accuracy".into(),
                            x_desc: "evaluation context length (tokens)".into(),
                            y_desc: "accuracy (value tokens)".into(),
                            curves: acc,
                            log2_x: true,
                            percent_y: true,
                            vlines,
                            legend: None,
                        },
                    ],
                    note: "zero-shot evaluation of models trained at one length; line: mean over seeds; band: min–max over seeds".into(),
                },
                out,
                "nll-vs-length",
            )?);
        }
        "real-sequences" => {
            // A selection's folder without length evaluations (the `tune` preset) has its
            // selection figure only.
            let evals = match table("evals") {
                Err(PlotError::MissingTable(_)) if selecting => return Ok(written),
                other => other?,
            };
            let mut corpora: Vec<String> = data::eval_corpora(&evals)?
                .into_iter()
                .flatten()
                .filter(|c| !c.is_empty())
                .collect();
            corpora.sort();
            corpora.dedup();
            let mut panels = Vec::new();
            for corpus in &corpora {
                let (nll, trains) = data::length_curves_where(&evals, "loss", Some(corpus))?;
                if nll.is_empty() {
                    continue;
                }
                panels.push(LinePanel {
                    title: corpus.clone(),
                    x_desc: "evaluation context length (tokens)".into(),
                    y_desc: "held-out NLL (nats per token)".into(),
                    curves: nll,
                    log2_x: true,
                    percent_y: false,
                    vlines: trains
                        .iter()
                        .map(|t| (*t as f64, format!("training length {t}")))
                        .collect(),
                    legend: (panels.is_empty()).then_some(SeriesLabelPosition::UpperLeft),
                });
            }
            if panels.is_empty() {
                return Err(empty(
                    "real-sequences-nll",
                    "evals.parquet has no rows with a corpus",
                ));
            }
            written.extend(save(
                &LinesPlot {
                    title: "Real sequences: held-out NLL beyond the training length".into(),
                    panels,
                    note: "zero-shot evaluation on the held-out end of each corpus; RoPE as trained (none) or scaled (PI = linear, NTK, YaRN); line: mean over seeds; band: min–max over seeds".into(),
                },
                out,
                "real-sequences-nll",
            )?);
        }
        "igsm-ops" => {
            let runs = table("runs")?;
            // The runs' own ops, and the other sizes their models were evaluated on (`quick`).
            let evals = match table("evals") {
                Ok(t) => Some(t),
                Err(PlotError::MissingTable(_)) => None,
                Err(e) => return Err(e),
            };
            let acc = data::igsm_by_ops(&runs, evals.as_ref(), "answer_accuracy")?;
            let theta = data::igsm_by_ops(&runs, evals.as_ref(), "effective_freq")?;
            if theta.is_empty() {
                return Err(empty("igsm-ops", "no finished run"));
            }
            written.extend(save(
                &LinesPlot {
                    title: "iGSM arithmetic: accuracy and frequency use vs operations".into(),
                    panels: vec![
                        LinePanel {
                            title: "answer accuracy (greedy decoding)".into(),
                            x_desc: "operations on the solution path".into(),
                            y_desc: "answer accuracy".into(),
                            curves: acc,
                            log2_x: false,
                            percent_y: true,
                            vlines: vec![],
                            legend: Some(SeriesLabelPosition::UpperRight),
                        },
                        LinePanel {
                            title: "effective frequency".into(),
                            x_desc: "operations on the solution path".into(),
                            y_desc: "θ_eff (rad/token)".into(),
                            curves: theta,
                            log2_x: false,
                            percent_y: false,
                            vlines: vec![],
                            legend: None,
                        },
                    ],
                    note: "line: mean over seeds; band: min–max over seeds".into(),
                },
                out,
                "igsm-ops",
            )?);
            // Learning curves of answer accuracy per ops (runs with `answer_curve > 0`).
            let answers = data::answer_curves_by_ops(&runs, &table("curves")?)?;
            if !answers.is_empty() {
                written.extend(save(
                    &LinesPlot {
                        title: "iGSM: answers while training, per ops".into(),
                        panels: vec![LinePanel {
                            title: "greedy-decoded answers, held-out structures".into(),
                            x_desc: "training step".into(),
                            y_desc: "answer accuracy".into(),
                            curves: answers,
                            log2_x: false,
                            percent_y: true,
                            vlines: vec![],
                            legend: Some(SeriesLabelPosition::UpperLeft),
                        }],
                        note: "line: mean over seeds; band: min–max over seeds".into(),
                    },
                    out,
                    "igsm-answer-curves",
                )?);
            }
        }
        "mi-profiles" => {
            let profiles = data::mi_profiles(&table("mi")?)?;
            if profiles.is_empty() {
                return Err(empty("mi-profiles", "mi.parquet has no rows"));
            }
            // Real corpora: raw and character-rescaled lags side by side (the collapse); the
            // synthetic tasks (`task:<name>`, one token per character) in their own figure, raw
            // lags only.
            let (tasks, corpora): (Vec<_>, Vec<_>) = profiles
                .into_iter()
                .partition(|p| p.corpus.starts_with("task:"));
            if !corpora.is_empty() {
                let fig = MiPlot {
                    profiles: corpora,
                    rescaled: true,
                };
                written.extend(save(&fig, out, "mi-profiles")?);
            }
            if !tasks.is_empty() {
                let fig = MiPlot {
                    profiles: tasks,
                    rescaled: false,
                };
                written.extend(save(&fig, out, "mi-tasks")?);
            }
        }
        _ => unreachable!("checked against SWEEP_FIGURES"),
    }
    Ok(written)
}

/// [`SELECTION_FIGURE`] of the folder `results` into `out` when its plan selects on validation
/// (`plan.json`'s `select`, R58); nothing otherwise, or when no candidate has the metric yet.
/// Drawn first by `lab plot` for every sweep, and by `lab report` for any sweep.
///
/// # Errors
/// A run table that cannot be read, a figure that cannot be written.
pub fn selection_figure(results: &Path, out: &Path) -> Result<Vec<PathBuf>, PlotError> {
    let Some(plan) = crate::results::plan::read(results) else {
        return Ok(vec![]);
    };
    let Some(sel) = &plan.select else {
        return Ok(vec![]);
    };
    let cands = crate::analysis::select::candidates(results, &plan.run_ids, sel)?;
    let choices = crate::analysis::select::choose(sel, &cands);
    let panels_data = data::selection_curves(&choices);
    if panels_data.is_empty() {
        return Ok(vec![]);
    }
    font::register()?;
    let axis = sel.over.first().cloned().unwrap_or_default();
    let panels = panels_data
        .into_iter()
        .enumerate()
        .map(|(i, (title, curves))| LinePanel {
            title,
            x_desc: axis.clone(),
            y_desc: format!("{} (validation)", sel.by.column()),
            curves,
            log2_x: true,
            percent_y: false,
            vlines: vec![],
            legend: (i == 0).then_some(SeriesLabelPosition::UpperRight),
        })
        .collect();
    save(
        &LinesPlot {
            title: format!("Selection on validation ({})", sel.describe()),
            panels,
            note: "line: mean over seeds; band: min–max over seeds; each seed's best point is its selected run".into(),
        },
        out,
        SELECTION_FIGURE,
    )
}

fn empty(figure: &str, why: &str) -> PlotError {
    PlotError::Empty {
        figure: figure.to_string(),
        why: why.to_string(),
    }
}

/// Draw `fig` to `<dir>/<stem>.png` and `<dir>/<stem>.svg` (temporary names, then renamed).
pub fn save<F: Figure>(fig: &F, dir: &Path, stem: &str) -> Result<Vec<PathBuf>, PlotError> {
    let size = fig.size();
    let mut written = Vec::new();
    for ext in ["png", "svg"] {
        let path = dir.join(format!("{stem}.{ext}"));
        let tmp = dir.join(format!(".{stem}.tmp-{}.{ext}", std::process::id()));
        let drawn: draw::DrawResult = if ext == "png" {
            let root = BitMapBackend::new(&tmp, size).into_drawing_area();
            (|| {
                root.fill(&WHITE)?;
                fig.draw(&root)?;
                root.present()?;
                Ok(())
            })()
        } else {
            let root = SVGBackend::new(&tmp, size).into_drawing_area();
            (|| {
                root.fill(&WHITE)?;
                fig.draw(&root)?;
                root.present()?;
                Ok(())
            })()
        };
        if let Err(e) = drawn {
            let _ = std::fs::remove_file(&tmp);
            return Err(PlotError::Draw {
                path,
                message: e.to_string(),
            });
        }
        std::fs::rename(&tmp, &path).map_err(|source| PlotError::Io {
            path: path.clone(),
            source,
        })?;
        written.push(path);
    }
    Ok(written)
}

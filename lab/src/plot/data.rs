//! The series each figure draws, computed from the sweep's tables (schemas in
//! `results/README.md`). Pure functions of [`Table`]s, so tests feed them hand-made tables.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use arrow_array::RecordBatch;

use super::PlotError;
use crate::analysis::{
    FitPoint, RunSetting, bootstrap_fits, fit_loglog, quantile_sorted, setting_labels,
};
use crate::model::Encoding;
use crate::results::{column, read_parquet};

/// A table read back from Parquet (all its batches), with checked column access.
#[derive(Clone, Debug)]
pub struct Table {
    /// Name used in error messages (the file, or a test's label).
    pub name: String,
    batches: Vec<RecordBatch>,
}

impl Table {
    /// Read a whole Parquet file. A missing file is [`PlotError::MissingTable`].
    pub fn read(path: &Path) -> Result<Self, PlotError> {
        if !path.is_file() {
            return Err(PlotError::MissingTable(path.to_path_buf()));
        }
        let (_, batches) = read_parquet(path)?;
        Ok(Self {
            name: path.display().to_string(),
            batches,
        })
    }

    /// [`Table::read`] of a run table, keeping the rows a selection on validation chose: rows
    /// whose `selected` is `false` are left out (docs/analysis-rules.md R58); a table without
    /// the column (no selection, or written before it existed) is read whole.
    pub fn read_selected(path: &Path) -> Result<Self, PlotError> {
        let mut t = Self::read(path)?;
        let mut kept = Vec::with_capacity(t.batches.len());
        for b in &t.batches {
            let Some(col) = b
                .column_by_name("selected")
                .and_then(|c| c.as_any().downcast_ref::<arrow_array::BooleanArray>())
            else {
                kept.push(b.clone());
                continue;
            };
            let keep: arrow_array::BooleanArray =
                col.iter().map(|v| Some(v != Some(false))).collect();
            kept.push(
                arrow_select::filter::filter_record_batch(b, &keep)
                    .expect("the mask is built from the batch, so their lengths agree"),
            );
        }
        t.batches = kept;
        Ok(t)
    }

    /// A table from record batches (tests, or tables built in memory).
    pub fn from_batches(name: &str, batches: Vec<RecordBatch>) -> Self {
        Self {
            name: name.to_string(),
            batches,
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.batches.iter().map(|b| b.num_rows()).sum()
    }

    /// The column names, in schema order (none for an empty table).
    pub fn column_names(&self) -> Vec<String> {
        self.batches
            .first()
            .map(|b| {
                b.schema()
                    .fields()
                    .iter()
                    .map(|f| f.name().clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The Arrow type of column `col` (`None` when absent or the table is empty).
    pub fn data_type(&self, col: &str) -> Option<arrow_schema::DataType> {
        let b = self.batches.first()?;
        let schema = b.schema();
        let (_, field) = schema.column_with_name(col)?;
        Some(field.data_type().clone())
    }

    /// Whether the table has column `col` (an empty table has none).
    pub fn has(&self, col: &str) -> bool {
        self.batches
            .first()
            .is_some_and(|b| b.schema().column_with_name(col).is_some())
    }

    fn check(&self, col: &str) -> Result<(), PlotError> {
        if self.rows() == 0 || self.has(col) {
            Ok(())
        } else {
            Err(PlotError::MissingColumn {
                table: self.name.clone(),
                column: col.to_string(),
            })
        }
    }

    /// A utf8 column, nulls as `None`.
    pub fn strs(&self, col: &str) -> Result<Vec<Option<String>>, PlotError> {
        use arrow_array::{Array, LargeStringArray, StringViewArray};
        self.check(col)?;
        // Utf8 as the lab writes it; LargeUtf8 and Utf8View as Polars and pyarrow may.
        Ok(self
            .batches
            .iter()
            .flat_map(|b| {
                let Some(c) = b.column_by_name(col) else {
                    return vec![None; b.num_rows()];
                };
                let any = c.as_any();
                let get = |i: usize, v: &dyn Fn(usize) -> String| c.is_valid(i).then(|| v(i));
                if let Some(a) = any.downcast_ref::<LargeStringArray>() {
                    (0..a.len())
                        .map(|i| get(i, &|i| a.value(i).into()))
                        .collect()
                } else if let Some(a) = any.downcast_ref::<StringViewArray>() {
                    (0..a.len())
                        .map(|i| get(i, &|i| a.value(i).into()))
                        .collect()
                } else {
                    column::strings(b, col)
                }
            })
            .collect())
    }

    /// A float64 column.
    pub fn f64s(&self, col: &str) -> Result<Vec<Option<f64>>, PlotError> {
        self.check(col)?;
        Ok(self
            .batches
            .iter()
            .flat_map(|b| column::floats(b, col))
            .collect())
    }

    /// An int64 column.
    pub fn i64s(&self, col: &str) -> Result<Vec<Option<i64>>, PlotError> {
        self.check(col)?;
        Ok(self
            .batches
            .iter()
            .flat_map(|b| column::ints(b, col))
            .collect())
    }

    /// A boolean column (MI tables' `significant`).
    pub fn bools(&self, col: &str) -> Result<Vec<Option<bool>>, PlotError> {
        use arrow_array::{Array, BooleanArray};
        self.check(col)?;
        Ok(self
            .batches
            .iter()
            .flat_map(|b| {
                let a = b
                    .column_by_name(col)
                    .and_then(|c| c.as_any().downcast_ref::<BooleanArray>().cloned());
                match a {
                    Some(a) => (0..a.len())
                        .map(|i| a.is_valid(i).then(|| a.value(i)))
                        .collect::<Vec<_>>(),
                    None => vec![None; b.num_rows()],
                }
            })
            .collect())
    }
}

/// Mean and spread of one quantity over seeds.
#[derive(Clone, Debug, PartialEq)]
pub struct Stat {
    /// Arithmetic mean.
    pub mean: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
    /// The values (one per seed or run), in input order.
    pub values: Vec<f64>,
}

impl Stat {
    /// `None` for no values.
    pub fn of(values: Vec<f64>) -> Option<Self> {
        if values.is_empty() {
            return None;
        }
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some(Self {
            mean,
            min,
            max,
            values,
        })
    }
}

/// Encodings in the order figures list them; others follow alphabetically.
const ENCODING_ORDER: [&str; 4] = ["rope", "pope", "tapa", "nope"];
/// RoPE scalings in the order figures list them.
const SCALING_ORDER: [&str; 6] = ["none", "linear", "ntk", "dynamic", "yarn", "llama3"];

fn rank(order: &[&str], s: &str) -> (usize, String) {
    (
        order.iter().position(|o| *o == s).unwrap_or(order.len()),
        s.to_string(),
    )
}

/// Sort key of a series label: RoPE first (`rope`, `rope + SCALING` or a bare scaling name, in
/// scaling order), then the other encodings in [`ENCODING_ORDER`], then anything else by name.
fn label_rank(label: &str) -> (usize, usize, String) {
    let (enc, sc) = match label.split_once(" + ") {
        Some((e, s)) => (e, s),
        None if SCALING_ORDER.contains(&label) => ("rope", label),
        None => (label, "none"),
    };
    (
        rank(&ENCODING_ORDER, enc).0,
        rank(&SCALING_ORDER, sc).0,
        label.to_string(),
    )
}

/// Rows of the runs table that finished (`status = done`; tables without the column: all).
fn done_rows(runs: &Table) -> Result<Vec<bool>, PlotError> {
    if !runs.has("status") {
        return Ok(vec![true; runs.rows()]);
    }
    Ok(runs
        .strs("status")?
        .into_iter()
        .map(|s| s.as_deref() == Some("done"))
        .collect())
}

// ---------------------------------------------------------------------------------------------
// block-width: spectrum heatmaps

/// Energy share per rotary frequency and block width for one (variant, layer): the spectrum
/// heatmap's cells, averaged over heads and over the runs (seeds) of each width, at each run's
/// last evaluation step.
#[derive(Clone, Debug, PartialEq)]
pub struct Heatmap {
    /// Task variant (`copy`, `recall`).
    pub variant: String,
    /// Layer, 0-based.
    pub layer: i64,
    /// Block widths `B` (tokens), ascending: the columns.
    pub widths: Vec<i64>,
    /// `θ_i` (radians per token) of each rotary pair `i = 0, 1, …` (descending): the rows.
    pub thetas: Vec<f64>,
    /// `share[i][j]`: mean `energy_frac` of pair `i` at width `widths[j]`; NaN where no run.
    pub share: Vec<Vec<f64>>,
    /// Runs averaged in each column.
    pub runs: Vec<usize>,
}

/// The spectrum heatmaps of `encoding`'s finished runs, one per (variant, layer), sorted.
/// Width is the runs table's `dep_width` (`block_len` in tables without it).
pub fn spectrum_heatmaps(
    runs: &Table,
    spectrum: &Table,
    encoding: &str,
) -> Result<Vec<Heatmap>, PlotError> {
    // run_id → (variant, width)
    let done = done_rows(runs)?;
    let ids = runs.strs("run_id")?;
    let encs = runs.strs("encoding")?;
    let vars = runs.strs("variant")?;
    let widths = width_column(runs)?;
    let mut meta: BTreeMap<String, (String, i64)> = BTreeMap::new();
    for i in 0..runs.rows() {
        if done[i]
            && encs[i].as_deref() == Some(encoding)
            && let (Some(id), Some(v), Some(w)) = (&ids[i], &vars[i], widths[i])
        {
            meta.insert(id.clone(), (v.clone(), w));
        }
    }
    let s_ids = spectrum.strs("run_id")?;
    let steps = spectrum.i64s("step")?;
    let layers = spectrum.i64s("layer")?;
    let fidx = spectrum.i64s("freq_index")?;
    let theta = spectrum.f64s("theta")?;
    let frac = spectrum.f64s("energy_frac")?;
    // Last evaluation step of each run.
    let mut last: BTreeMap<&str, i64> = BTreeMap::new();
    for i in 0..spectrum.rows() {
        if let (Some(id), Some(s)) = (&s_ids[i], steps[i])
            && meta.contains_key(id)
        {
            let e = last.entry(id.as_str()).or_insert(s);
            *e = (*e).max(s);
        }
    }
    // (variant, layer) → width → run → freq_index → (sum over heads, heads)
    type Cells = BTreeMap<i64, BTreeMap<String, BTreeMap<i64, (f64, usize)>>>;
    let mut acc: BTreeMap<(String, i64), Cells> = BTreeMap::new();
    let mut thetas: BTreeMap<i64, f64> = BTreeMap::new();
    for i in 0..spectrum.rows() {
        let (Some(id), Some(s), Some(l), Some(f), Some(t), Some(p)) =
            (&s_ids[i], steps[i], layers[i], fidx[i], theta[i], frac[i])
        else {
            continue;
        };
        let Some((var, w)) = meta.get(id) else {
            continue;
        };
        if last.get(id.as_str()) != Some(&s) {
            continue;
        }
        thetas.insert(f, t);
        let cell = acc
            .entry((var.clone(), l))
            .or_default()
            .entry(*w)
            .or_default()
            .entry(id.clone())
            .or_default()
            .entry(f)
            .or_insert((0.0, 0));
        cell.0 += p;
        cell.1 += 1;
    }
    let n_freq = thetas.len();
    let theta_list: Vec<f64> = thetas.values().copied().collect();
    let mut out = Vec::new();
    for ((variant, layer), by_width) in acc {
        let widths: Vec<i64> = by_width.keys().copied().collect();
        let mut share = vec![vec![f64::NAN; widths.len()]; n_freq];
        let mut n_runs = Vec::new();
        for (j, (_, by_run)) in by_width.iter().enumerate() {
            n_runs.push(by_run.len());
            for (fi, (f, _)) in thetas.iter().enumerate() {
                let vals: Vec<f64> = by_run
                    .values()
                    .filter_map(|m| m.get(f).map(|(s, n)| s / *n as f64))
                    .collect();
                if !vals.is_empty() {
                    share[fi][j] = vals.iter().sum::<f64>() / vals.len() as f64;
                }
            }
        }
        out.push(Heatmap {
            variant,
            layer,
            widths,
            thetas: theta_list.clone(),
            share,
            runs: n_runs,
        });
    }
    Ok(out)
}

fn width_column(runs: &Table) -> Result<Vec<Option<i64>>, PlotError> {
    if runs.has("dep_width") {
        runs.i64s("dep_width")
    } else {
        runs.i64s("block_len")
    }
}

/// Per row of `runs`, the group label's setting as `sweep::law::fits` writes it
/// ([`crate::analysis::setting_labels`] over the finished rows; empty for the others).
fn run_setting_labels(runs: &Table, done: &[bool]) -> Result<Vec<String>, PlotError> {
    let n = runs.rows();
    let f = |c: &str| -> Result<Vec<Option<f64>>, PlotError> {
        if runs.has(c) {
            runs.f64s(c)
        } else {
            Ok(vec![None; n])
        }
    };
    let i = |c: &str| -> Result<Vec<Option<i64>>, PlotError> {
        if runs.has(c) {
            runs.i64s(c)
        } else {
            Ok(vec![None; n])
        }
    };
    let layout = if runs.has("pair_layout") {
        runs.strs("pair_layout")?
    } else {
        vec![None; n]
    };
    let (base, len) = (f("rope_base")?, i("seq_len")?);
    let (rope_p, rotary_dim, nope_every) = (f("rope_p")?, i("rotary_dim")?, i("nope_every")?);
    let n_layers = i("n_layers")?;
    let rows: Vec<usize> = (0..n).filter(|&k| done[k]).collect();
    let settings: Vec<RunSetting> = rows
        .iter()
        .map(|&k| RunSetting {
            rope_base: base[k].unwrap_or(0.0),
            seq_len: len[k].unwrap_or(0),
            pair_layout: layout[k].clone().unwrap_or_default(),
            rope_p: rope_p[k],
            rotary_dim: rotary_dim[k],
            nope_every: nope_every[k],
            n_layers: n_layers[k].unwrap_or(0),
        })
        .collect();
    let mut out = vec![String::new(); n];
    for (k, label) in rows.into_iter().zip(setting_labels(&settings)) {
        out[k] = label;
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// block-width: the law θ_eff = c · W^(−β)

/// One fitted group of the law figure: its runs, the fit and a pointwise bootstrap band.
#[derive(Clone, Debug, PartialEq)]
pub struct LawGroup {
    /// `encoding/variant · pooling`, e.g. `rope/copy · positional`, `rope/copy · layer 0`
    /// (`encoding/variant` alone for results without per-layer tables).
    pub group: String,
    /// `(W, θ_eff, seed)` of every finished run of the group (tokens, radians per token).
    pub points: Vec<(f64, f64, i64)>,
    /// Fitted exponent β and constant c (radians): `fit.parquet`'s row when present, else
    /// refitted from the points.
    pub beta: f64,
    /// Fitted constant c, radians.
    pub c: f64,
    /// 95 % bootstrap interval of β, when `fit.parquet` has the group.
    pub beta_ci: Option<(f64, f64)>,
    /// R² of the log-log fit.
    pub r2: f64,
    /// `(W, lo, hi)`: 2.5 % and 97.5 % percentiles over bootstrap refits of `c·W^(−β)` at 40
    /// log-spaced widths spanning the data (the same replicates as the sweep's interval, seed 0,
    /// 2000 draws).
    pub band: Vec<(f64, f64, f64)>,
}

/// The law figure: fitted groups, and the NoPE control's points (not fitted).
#[derive(Clone, Debug, PartialEq)]
pub struct LawFigure {
    /// Rotary groups, sorted by name.
    pub groups: Vec<LawGroup>,
    /// `(variant, W, θ_eff)` of NoPE runs: the q/k pair-norm structure measured on the RoPE grid.
    pub control: Vec<(String, f64, f64)>,
}

/// Bootstrap replicates for the band; the sweep's fit uses the same count and seed.
pub const LAW_BOOT: usize = 2000;

/// The law figure's data from `runs` (finished runs' width and θ_eff), `layers` (each layer's
/// θ_eff at the final evaluation; `None` for results written before that table existed) and
/// `fit` (the sweep's fits; `None` or a missing row → refitted here).
///
/// Groups are `encoding/variant · pooling` with the poolings of docs/analysis-rules.md R1:
/// `positional` (the run's positional layer) and `layer l` for every layer. Results without
/// `layers`, or of one-layer models, give one `all` group per encoding/variant (the pooled θ_eff).
pub fn law_figure(
    runs: &Table,
    layers: Option<&Table>,
    fit: Option<&Table>,
) -> Result<LawFigure, PlotError> {
    let done = done_rows(runs)?;
    let encs = runs.strs("encoding")?;
    let vars = runs.strs("variant")?;
    let ids = runs.strs("run_id")?;
    let widths = width_column(runs)?;
    let theta = runs.f64s("effective_freq")?;
    let theta_pos = if runs.has("effective_freq_positional") && layers.is_some() {
        Some(runs.f64s("effective_freq_positional")?)
    } else {
        None
    };
    let seeds = runs.i64s("seed")?;
    // Settings the sweep varies besides the width (sweeps/base-vs-width.toml): named in the
    // group label as the sweep's fit table names them (`rope/copy base=100 L=512`).
    let setting = run_setting_labels(runs, &done)?;
    // θ_eff per (run id, layer) at the final evaluation.
    let mut per_layer: BTreeMap<(String, i64), f64> = BTreeMap::new();
    if let Some(l) = layers {
        let (id, layer, th, fin) = (
            l.strs("run_id")?,
            l.i64s("layer")?,
            l.f64s("effective_freq")?,
            l.bools("is_final")?,
        );
        for i in 0..l.rows() {
            if let (Some(id), Some(layer), Some(t), Some(true)) = (&id[i], layer[i], th[i], fin[i])
            {
                per_layer.insert((id.clone(), layer), t);
            }
        }
    }
    let n_layers = per_layer.keys().map(|k| k.1 + 1).max().unwrap_or(0);
    // One layer: positional = layer 0 = all; draw the one pooled group.
    let theta_pos = theta_pos.filter(|_| n_layers > 1);
    // (group label, fit-table key (group, pooling)) → points.
    let mut groups: BTreeMap<(String, String), Vec<(f64, f64, i64)>> = BTreeMap::new();
    let mut control = Vec::new();
    let ok = |t: f64| t > 0.0 && t.is_finite();
    for i in 0..runs.rows() {
        let (true, Some(e), Some(v), Some(w), Some(s)) =
            (done[i], &encs[i], &vars[i], widths[i], seeds[i])
        else {
            continue;
        };
        let rotary =
            serde_json::from_value::<Encoding>(serde_json::json!(e)).is_ok_and(Encoding::is_rotary);
        match e.as_str() {
            _ if rotary => {
                let g = format!("{e}/{v}{}", setting[i]);
                let mut add = |pooling: &str, t: Option<f64>| {
                    if let Some(t) = t.filter(|&t| ok(t)) {
                        groups
                            .entry((g.clone(), pooling.to_string()))
                            .or_default()
                            .push((w as f64, t, s));
                    }
                };
                match &theta_pos {
                    Some(tp) => {
                        add("positional", tp[i]);
                        for l in 0..n_layers {
                            let t = ids[i]
                                .as_ref()
                                .and_then(|id| per_layer.get(&(id.clone(), l)).copied());
                            add(&format!("layer:{l}"), t);
                        }
                    }
                    None => add("all", theta[i]),
                }
            }
            "nope" => {
                if let Some(t) = theta[i].filter(|&t| ok(t)) {
                    control.push((v.clone(), w as f64, t));
                }
            }
            _ => {}
        }
    }
    // The sweep's fits with W = B (width_source `dep_width`), keyed by (group, pooling); tables
    // without a pooling column hold the `all` fits.
    let mut fitted: BTreeMap<(String, String), (f64, f64, f64, Option<(f64, f64)>)> =
        BTreeMap::new();
    if let Some(f) = fit.filter(|f| f.rows() > 0) {
        let (g, b, c, r2, lo, hi) = (
            f.strs("group")?,
            f.f64s("beta")?,
            f.f64s("c")?,
            f.f64s("r2")?,
            f.f64s("beta_ci_low")?,
            f.f64s("beta_ci_high")?,
        );
        let pooling = if f.has("pooling") {
            f.strs("pooling")?
        } else {
            vec![Some("all".to_string()); f.rows()]
        };
        let source = if f.has("width_source") {
            f.strs("width_source")?
        } else {
            vec![None; f.rows()]
        };
        // One seed: the sweep prints no interval, and neither does the figure.
        let seeds = if f.has("n_seeds") {
            f.i64s("n_seeds")?
        } else {
            vec![None; f.rows()]
        };
        for i in 0..f.rows() {
            if source[i].as_deref().is_some_and(|s| s != "dep_width") {
                continue;
            }
            if let (Some(g), Some(p), Some(b), Some(c), Some(r2), Some(lo), Some(hi)) =
                (&g[i], &pooling[i], b[i], c[i], r2[i], lo[i], hi[i])
            {
                let ci = (seeds[i].is_none_or(|n| n >= 2)).then_some((lo, hi));
                fitted.insert((g.clone(), p.clone()), (b, c, r2, ci));
            }
        }
    }
    let mut out = Vec::new();
    for ((group, pooling), points) in groups {
        let fp: Vec<FitPoint> = points
            .iter()
            .map(|&(w, t, s)| FitPoint {
                width: w,
                theta: t,
                seed: s as u64,
            })
            .collect();
        let Some(own) = fit_loglog(&fp) else {
            continue; // one width: nothing to fit
        };
        let (beta, c, r2, beta_ci) = match fitted.get(&(group.clone(), pooling.clone())) {
            Some(&(b, c, r2, ci)) => (b, c, r2, ci),
            None => (own.beta, own.c, own.r2, None),
        };
        let reps = bootstrap_fits(&fp, LAW_BOOT, 0);
        let wmin = points.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
        let wmax = points.iter().map(|p| p.0).fold(0.0, f64::max);
        let band = (0..40)
            .map(|k| {
                let w = wmin * (wmax / wmin).powf(k as f64 / 39.0);
                let mut ys: Vec<f64> = reps.iter().map(|f| f.c * w.powf(-f.beta)).collect();
                ys.sort_by(|a, b| a.total_cmp(b));
                if ys.is_empty() {
                    let y = c * w.powf(-beta);
                    (w, y, y)
                } else {
                    (w, quantile_sorted(&ys, 0.025), quantile_sorted(&ys, 0.975))
                }
            })
            .collect();
        out.push(LawGroup {
            group: if pooling == "all" {
                group
            } else {
                format!("{group} · {}", pooling.replace(':', " "))
            },
            points,
            beta,
            c,
            beta_ci,
            r2,
            band,
        });
    }
    Ok(LawFigure {
        groups: out,
        control,
    })
}

// ---------------------------------------------------------------------------------------------
// Bars and curves over seeds

/// One bar: a label and the seeds' values.
#[derive(Clone, Debug, PartialEq)]
pub struct Bar {
    /// Bar label (an encoding, a scaling).
    pub label: String,
    /// Values over seeds.
    pub stat: Stat,
}

/// Final held-out accuracy of every finished run, one bar per encoding (seeds pooled), in the
/// order RoPE, PoPE, TAPA, NoPE, then others.
pub fn accuracy_by_encoding(runs: &Table) -> Result<Vec<Bar>, PlotError> {
    let done = done_rows(runs)?;
    let encs = runs.strs("encoding")?;
    let acc = runs.f64s("final_eval_accuracy")?;
    let mut by: BTreeMap<(usize, String), Vec<f64>> = BTreeMap::new();
    for i in 0..runs.rows() {
        if let (true, Some(e), Some(a)) = (done[i], &encs[i], acc[i]) {
            by.entry(rank(&ENCODING_ORDER, e)).or_default().push(a);
        }
    }
    Ok(by
        .into_iter()
        .filter_map(|((_, label), v)| Stat::of(v).map(|stat| Bar { label, stat }))
        .collect())
}

/// One panel of the PI figure: bars of accuracy grouped by length ratio.
#[derive(Clone, Debug, PartialEq)]
pub struct BarPanel {
    /// Panel title: `eval_name · task/variant` (iGSM: `eval_name · igsm`).
    pub title: String,
    /// Length ratios `s = seq_len / train_seq_len`, ascending: the groups.
    pub ratios: Vec<f64>,
    /// Bar labels: the RoPE scaling (`none`, `linear`, …), or the encoding for non-RoPE runs.
    pub labels: Vec<String>,
    /// `cells[r][b]`: accuracy over seeds at `ratios[r]` for `labels[b]`.
    pub cells: Vec<Vec<Option<Stat>>>,
}

/// Bar labels of the indirect-indexing attention figure, in order (the `attention` table's roles).
pub const ATTENTION_ROLES: [(&str, &str); 4] = [
    ("source", "query letter in the string (content)"),
    ("target", "answer letter (shift from it)"),
    ("query", "query token"),
    ("other_letter", "other letters"),
];

/// The encoding of a `(layer, head)` group in [`attention_panels`]' `ratios`: `layer · 64 + head`.
pub const LAYER_HEAD_BASE: i64 = 64;

/// "What vs where" for indirect indexing (issue 18, item 3): one panel per encoding × model setting
/// (the settings that differ between the runs: `n_layers`, `d_model`, `n_heads`, the rung, `steps`,
/// `batch_size`, `train_examples`, `pope_delta_init`), groups =
/// (layer, head) encoded as `layer · 64 + head` ([`LAYER_HEAD_BASE`]), bars = the final token's mean
/// attention on the source letter, the target letter, the query token and the other letters
/// ([`ATTENTION_ROLES`]), over seeds. Rows: the `attention` table joined to finished `runs` by `run_id`.
pub fn attention_panels(attention: &Table, runs: &Table) -> Result<Vec<BarPanel>, PlotError> {
    let done = done_rows(runs)?;
    let ids = runs.strs("run_id")?;
    let encs = runs.strs("encoding")?;
    let settings = [
        "n_layers",
        "d_model",
        "n_heads",
        "min_letters",
        "max_letters",
        "max_shift",
        "steps",
        "batch_size",
        "train_examples",
        "pope_delta_init",
    ];
    // Every setting as text (integers and PoPE's δ initialisation alike), `None` where absent.
    let mut values: Vec<Vec<Option<String>>> = Vec::new();
    for c in settings {
        values.push(if !runs.has(c) {
            vec![None; runs.rows()]
        } else if c == "pope_delta_init" {
            runs.strs(c)?
        } else {
            runs.i64s(c)?
                .into_iter()
                .map(|v| v.map(|x| x.to_string()))
                .collect()
        });
    }
    let varies: Vec<bool> = values
        .iter()
        .map(|v| {
            let set: std::collections::BTreeSet<_> = (0..runs.rows())
                .filter(|&i| done[i])
                .map(|i| v[i].clone())
                .collect();
            set.len() > 1
        })
        .collect();
    let mut panel_of: BTreeMap<String, (usize, String)> = BTreeMap::new();
    for i in 0..runs.rows() {
        if let (true, Some(id), Some(e)) = (done[i], &ids[i], &encs[i]) {
            let mut title = e.clone();
            for (c, (v, &vary)) in settings.iter().zip(values.iter().zip(&varies)) {
                if let (true, Some(x)) = (vary, &v[i]) {
                    title.push_str(&format!(" {c}={x}"));
                }
            }
            panel_of.insert(id.clone(), (rank(&ENCODING_ORDER, e).0, title));
        }
    }
    let a_ids = attention.strs("run_id")?;
    let layer = attention.i64s("layer")?;
    let head = attention.i64s("head")?;
    let role = attention.strs("role")?;
    let share = attention.f64s("share")?;
    // (panel order, title) → group → role → values over runs.
    type Cells = BTreeMap<i64, BTreeMap<usize, Vec<f64>>>;
    let mut by: BTreeMap<(usize, String), Cells> = BTreeMap::new();
    for i in 0..attention.rows() {
        let (Some(id), Some(l), Some(h), Some(r), Some(v)) =
            (&a_ids[i], layer[i], head[i], &role[i], share[i])
        else {
            continue;
        };
        let (Some(panel), Some(b)) = (
            panel_of.get(id),
            ATTENTION_ROLES.iter().position(|(name, _)| name == r),
        ) else {
            continue;
        };
        by.entry(panel.clone())
            .or_default()
            .entry(l * LAYER_HEAD_BASE + h)
            .or_default()
            .entry(b)
            .or_default()
            .push(v);
    }
    Ok(by
        .into_iter()
        .map(|((_, title), groups)| {
            let ratios: Vec<f64> = groups.keys().map(|&g| g as f64).collect();
            let cells = groups
                .into_values()
                .map(|mut roles| {
                    (0..ATTENTION_ROLES.len())
                        .map(|b| roles.remove(&b).and_then(Stat::of))
                        .collect()
                })
                .collect();
            BarPanel {
                title,
                ratios,
                labels: ATTENTION_ROLES.iter().map(|(_, l)| l.to_string()).collect(),
                cells,
            }
        })
        .collect())
}

/// Bar labels of the ablation figure, in order: unablated, law band, far band.
pub const ABLATION_LABELS: [&str; 3] = ["unablated", "π/B band at θ = 0", "far band at θ = 0"];

/// The causal check (SCIENCE.md §8; docs/analysis-rules.md R5) as panels of grouped bars: one
/// panel per RoPE block variant, groups = block width B (in `ratios`), bars = the held-out
/// accuracy unablated, with the law band at θ = 0, and with the far band at θ = 0, over seeds.
/// Rows: `evals` rows of RoPE runs at the training length without scaling that carry an
/// `ablate_band` column (empty = unablated) and whose run has an ablated evaluation.
pub fn ablation_panels(evals: &Table) -> Result<Vec<BarPanel>, PlotError> {
    if !evals.has("ablate_band") {
        return Ok(Vec::new());
    }
    let ids = evals.strs("run_id")?;
    let names = evals.strs("eval_name")?;
    let vars = evals.strs("variant")?;
    let encs = evals.strs("encoding")?;
    let ratio = evals.f64s("length_ratio")?;
    let scaling = evals.strs("scaling")?;
    let block = evals.i64s("block_len")?;
    let band = evals.strs("ablate_band")?;
    let acc = evals.f64s("accuracy")?;
    // Entries (run, eval name) that have an ablation: only their unablated rows are baselines.
    let ablated: BTreeSet<(String, String)> = (0..evals.rows())
        .filter(|&i| band[i].as_deref().is_some_and(|b| !b.is_empty()))
        .filter_map(|i| Some((ids[i].clone()?, names[i].clone()?)))
        .collect();
    let mut panels: BTreeMap<String, BTreeMap<i64, [Vec<f64>; 3]>> = BTreeMap::new();
    for i in 0..evals.rows() {
        let (
            Some(id),
            Some(n),
            Some(v),
            Some("rope"),
            Some(1.0),
            Some("none"),
            Some(b),
            Some(bd),
            Some(a),
        ) = (
            &ids[i],
            &names[i],
            &vars[i],
            encs[i].as_deref(),
            ratio[i],
            scaling[i].as_deref(),
            block[i],
            band[i].as_deref(),
            acc[i],
        )
        else {
            continue;
        };
        if !ablated.contains(&(id.clone(), n.clone())) {
            continue;
        }
        let k = match bd {
            "" => 0,
            "law" => 1,
            "far" => 2,
            _ => continue,
        };
        panels
            .entry(format!("rope/{v}"))
            .or_default()
            .entry(b)
            .or_default()[k]
            .push(a);
    }
    Ok(panels
        .into_iter()
        .map(|(title, by_width)| BarPanel {
            title,
            ratios: by_width.keys().map(|&b| b as f64).collect(),
            labels: ABLATION_LABELS.iter().map(|l| l.to_string()).collect(),
            cells: by_width
                .into_values()
                .map(|cells| cells.into_iter().map(Stat::of).collect())
                .collect(),
        })
        .collect())
}

/// The PI table as panels of grouped bars: one panel per (eval name, task/variant), groups
/// = length ratio, bars = scaling (RoPE) or encoding (others, as trained), values = accuracy
/// (`evals.accuracy`) over seeds.
pub fn pi_panels(evals: &Table) -> Result<Vec<BarPanel>, PlotError> {
    let names = evals.strs("eval_name")?;
    let tasks = evals.strs("task")?;
    let vars = evals.strs("variant")?;
    let encs = evals.strs("encoding")?;
    let ratio = evals.f64s("length_ratio")?;
    let scaling = evals.strs("scaling")?;
    let acc = evals.f64s("accuracy")?;
    // panel → ratio (as bits of the f64, sortable for positive values) → label → values
    type Cells = BTreeMap<u64, BTreeMap<(usize, usize, String), Vec<f64>>>;
    let mut panels: BTreeMap<String, Cells> = BTreeMap::new();
    for i in 0..evals.rows() {
        // `variant` is the block task's parameter: null for the other tasks' rows (schema 2).
        let (Some(n), Some(t), Some(e), Some(r), Some(s), Some(a)) = (
            &names[i],
            &tasks[i],
            &encs[i],
            ratio[i],
            &scaling[i],
            acc[i],
        ) else {
            continue;
        };
        let title = match &vars[i] {
            Some(v) if t == "block" => format!("{n} · {t}/{v}"),
            _ => format!("{n} · {t}"),
        };
        let label = if e == "rope" { s.clone() } else { e.clone() };
        panels
            .entry(title)
            .or_default()
            .entry(r.to_bits())
            .or_default()
            .entry(label_rank(&label))
            .or_default()
            .push(a);
    }
    Ok(panels
        .into_iter()
        .map(|(title, by_ratio)| {
            let labels: BTreeSet<(usize, usize, String)> =
                by_ratio.values().flat_map(|m| m.keys().cloned()).collect();
            let labels: Vec<(usize, usize, String)> = labels.into_iter().collect();
            let ratios = by_ratio.keys().map(|b| f64::from_bits(*b)).collect();
            let cells = by_ratio
                .values()
                .map(|m| {
                    labels
                        .iter()
                        .map(|l| m.get(l).and_then(|v| Stat::of(v.clone())))
                        .collect()
                })
                .collect();
            BarPanel {
                title,
                ratios,
                labels: labels.into_iter().map(|l| l.2).collect(),
                cells,
            }
        })
        .collect())
}

/// A line over seeds: `(x, stat)` points, ascending x.
#[derive(Clone, Debug, PartialEq)]
pub struct Curve {
    /// Series label: an encoding, or `rope + SCALING` for a scaled RoPE.
    pub label: String,
    /// Points.
    pub points: Vec<(f64, Stat)>,
}

fn curves_from(by: BTreeMap<(usize, usize, String), BTreeMap<i64, Vec<f64>>>) -> Vec<Curve> {
    by.into_iter()
        .map(|((_, _, label), pts)| Curve {
            label,
            points: pts
                .into_iter()
                .filter_map(|(x, v)| Stat::of(v).map(|s| (x as f64, s)))
                .collect(),
        })
        .collect()
}

/// Length-extrapolation curves: `metric` (`loss`, nats, or `accuracy`) of `evals` against the
/// evaluated `seq_len`, one curve per encoding (RoPE: per scaling, the 1× point shared by every
/// scaling since no scaling applies there), over seeds. Also returns the training lengths.
pub fn length_curves(evals: &Table, metric: &str) -> Result<(Vec<Curve>, Vec<i64>), PlotError> {
    length_curves_where(evals, metric, None)
}

/// The corpus of each evaluation row: the `corpus` column, or for tables written before it
/// existed the `corpus` field of `config_json`.
///
/// # Errors
/// Neither column present.
pub fn eval_corpora(evals: &Table) -> Result<Vec<Option<String>>, PlotError> {
    if evals.has("corpus") || !evals.has("config_json") {
        return evals.strs("corpus");
    }
    Ok(evals
        .strs("config_json")?
        .into_iter()
        .map(|j| {
            let v: serde_json::Value = serde_json::from_str(j.as_deref()?).ok()?;
            v.get("corpus")?.as_str().map(str::to_string)
        })
        .collect())
}

/// [`length_curves`] over the rows whose `corpus` column equals `corpus` (the real-sequences
/// sweep: one set of curves per corpus); `None` takes every row.
///
/// # Errors
/// A missing column (`corpus` included when `corpus` is given).
pub fn length_curves_where(
    evals: &Table,
    metric: &str,
    corpus: Option<&str>,
) -> Result<(Vec<Curve>, Vec<i64>), PlotError> {
    let keep: Vec<bool> = match corpus {
        Some(c) => eval_corpora(evals)?
            .iter()
            .map(|v| v.as_deref() == Some(c))
            .collect(),
        None => vec![true; evals.rows()],
    };
    let encs = evals.strs("encoding")?;
    let scaling = evals.strs("scaling")?;
    let len = evals.i64s("seq_len")?;
    let train = evals.i64s("train_seq_len")?;
    let y = evals.f64s(metric)?;
    let rope_scalings: BTreeSet<String> = (0..evals.rows())
        .filter(|&i| keep[i] && encs[i].as_deref() == Some("rope") && len[i] != train[i])
        .filter_map(|i| scaling[i].clone())
        .collect();
    let mut by: BTreeMap<(usize, usize, String), BTreeMap<i64, Vec<f64>>> = BTreeMap::new();
    let mut trains = BTreeSet::new();
    for i in (0..evals.rows()).filter(|&i| keep[i]) {
        let (Some(e), Some(s), Some(l), Some(t), Some(v)) =
            (&encs[i], &scaling[i], len[i], train[i], y[i])
        else {
            continue;
        };
        trains.insert(t);
        let labels: Vec<String> = if e != "rope" {
            vec![e.clone()]
        } else if l == t {
            // The training length: every scaling is the identity there.
            rope_scalings
                .iter()
                .map(|s| format!("rope + {s}"))
                .collect()
        } else {
            vec![format!("rope + {s}")]
        };
        for label in labels {
            by.entry(label_rank(&label))
                .or_default()
                .entry(l)
                .or_default()
                .push(v);
        }
    }
    Ok((curves_from(by), trains.into_iter().collect()))
}

/// `metric` of finished runs against the runs column `x` (e.g. `ops`), one curve per encoding,
/// over seeds.
pub fn runs_curves(runs: &Table, x: &str, metric: &str) -> Result<Vec<Curve>, PlotError> {
    let done = done_rows(runs)?;
    let encs = runs.strs("encoding")?;
    let xs = runs.i64s(x)?;
    let y = runs.f64s(metric)?;
    let mut by: BTreeMap<(usize, usize, String), BTreeMap<i64, Vec<f64>>> = BTreeMap::new();
    for i in 0..runs.rows() {
        if let (true, Some(e), Some(x), Some(v)) = (done[i], &encs[i], xs[i], y[i])
            && v.is_finite()
        {
            by.entry(label_rank(e))
                .or_default()
                .entry(x)
                .or_default()
                .push(v);
        }
    }
    Ok(curves_from(by))
}

/// iGSM: `metric` (`answer_accuracy` or `effective_freq`) against the number of operations of
/// the evaluated problems, one curve per encoding over seeds. Each finished run gives a point at
/// its own `ops` (`runs.<metric>`) and, when `evals` is given, one at every other size it was
/// evaluated on at its training length unscaled (`evals` rows with `length_ratio = 1`, scaling
/// `none`, `ablate_band` empty, `task.ops` of `config_json` ≠ the run's `ops`; e.g. the `quick`
/// preset's `ops2` and `ops3`; of repeated evaluations of a run at one size, the first). When
/// such points exist and the runs were trained at several `ops`, the curves are per model size
/// (`rope, model ops 4`).
///
/// # Errors
/// A missing column of `runs`, or of `evals` when given.
pub fn igsm_by_ops(
    runs: &Table,
    evals: Option<&Table>,
    metric: &str,
) -> Result<Vec<Curve>, PlotError> {
    let done = done_rows(runs)?;
    let (ids, encs, ops, y) = (
        runs.strs("run_id")?,
        runs.strs("encoding")?,
        runs.i64s("ops")?,
        runs.f64s(metric)?,
    );
    // (encoding, model ops, evaluated ops, value)
    let mut points: Vec<(String, i64, i64, f64)> = Vec::new();
    let mut of_run: BTreeMap<String, (String, i64)> = BTreeMap::new();
    for i in 0..runs.rows() {
        let (true, Some(e), Some(k)) = (done[i], &encs[i], ops[i]) else {
            continue;
        };
        if let Some(id) = &ids[i] {
            of_run.insert(id.clone(), (e.clone(), k));
        }
        if let Some(v) = y[i]
            && v.is_finite()
        {
            points.push((e.clone(), k, k, v));
        }
    }
    if let Some(ev) = evals
        && ev.has(metric)
        && ev.has("config_json")
    {
        let (ev_ids, ratio, scaling, json, v) = (
            ev.strs("run_id")?,
            ev.f64s("length_ratio")?,
            ev.strs("scaling")?,
            ev.strs("config_json")?,
            ev.f64s(metric)?,
        );
        let band = if ev.has("ablate_band") {
            ev.strs("ablate_band")?
        } else {
            vec![None; ev.rows()]
        };
        let mut seen: BTreeSet<(String, i64)> = BTreeSet::new();
        for i in 0..ev.rows() {
            let (Some(id), Some(r), Some(j), Some(v)) = (&ev_ids[i], ratio[i], &json[i], v[i])
            else {
                continue;
            };
            let unscaled = matches!(scaling[i].as_deref(), None | Some("none"));
            let Some((e, k)) = of_run.get(id) else {
                continue;
            };
            // `ablate_band` is "" (or null) on evaluations without an ablation.
            let ablated = band[i].as_deref().is_some_and(|b| !b.is_empty());
            if r != 1.0 || !unscaled || ablated || !v.is_finite() {
                continue;
            }
            let o = serde_json::from_str::<serde_json::Value>(j)
                .ok()
                .and_then(|c| c.pointer("/task/ops")?.as_i64());
            // One point per (run, size): `lab eval` may have evaluated the same problems again.
            if let Some(o) = o
                && o != *k
                && seen.insert((id.clone(), o))
            {
                points.push((e.clone(), *k, o, v));
            }
        }
    }
    let trained: BTreeSet<i64> = points.iter().map(|p| p.1).collect();
    let per_model = trained.len() > 1 && points.iter().any(|p| p.1 != p.2);
    let mut by: BTreeMap<(usize, usize, String), BTreeMap<i64, Vec<f64>>> = BTreeMap::new();
    for (e, k, o, v) in points {
        let (rank, _, _) = label_rank(&e);
        let key = if per_model {
            (rank, k as usize, format!("{e}, model ops {k}"))
        } else {
            (rank, 0, e.clone())
        };
        by.entry(key).or_default().entry(o).or_default().push(v);
    }
    Ok(curves_from(by))
}

/// Held-out accuracy against training step, one curve per encoding over seeds (`curves`
/// table's `eval` rows joined to the runs' encodings).
pub fn eval_accuracy_curves(runs: &Table, curves: &Table) -> Result<Vec<Curve>, PlotError> {
    let done = done_rows(runs)?;
    let ids = runs.strs("run_id")?;
    let encs = runs.strs("encoding")?;
    let enc_of: BTreeMap<String, String> = (0..runs.rows())
        .filter(|&i| done[i])
        .filter_map(|i| Some((ids[i].clone()?, encs[i].clone()?)))
        .collect();
    let (c_ids, split, step, acc) = (
        curves.strs("run_id")?,
        curves.strs("split")?,
        curves.i64s("step")?,
        curves.f64s("accuracy")?,
    );
    let mut by: BTreeMap<(usize, usize, String), BTreeMap<i64, Vec<f64>>> = BTreeMap::new();
    for i in 0..curves.rows() {
        if let (Some(id), Some("eval"), Some(s), Some(a)) =
            (&c_ids[i], split[i].as_deref(), step[i], acc[i])
            && let Some(e) = enc_of.get(id)
        {
            by.entry(label_rank(e))
                .or_default()
                .entry(s)
                .or_default()
                .push(a);
        }
    }
    Ok(curves_from(by))
}

/// iGSM: greedy answer accuracy against training step, one curve per (encoding, evaluated `ops`)
/// over seeds: the eval rows' `curves.answer_accuracy` (written at every evaluation by runs with
/// `answer_curve > 0`, on problems of the run's own `ops`) and the `split = "answers"` rows of
/// runs with `answer_curve_min_ops > 0` (the same model on problems of `answer_ops` operations).
/// Labelled `ops 2` (or `pope, ops 2` when the finished runs have several encodings; with
/// `(model ops 4)` appended when runs trained at several `ops` also decode other sizes), ordered
/// by encoding, then evaluated `ops`, then the model's. Empty when no run wrote the column.
pub fn answer_curves_by_ops(runs: &Table, curves: &Table) -> Result<Vec<Curve>, PlotError> {
    if !curves.has("answer_accuracy") {
        return Ok(Vec::new());
    }
    let done = done_rows(runs)?;
    let (ids, encs, ops) = (
        runs.strs("run_id")?,
        runs.strs("encoding")?,
        runs.i64s("ops")?,
    );
    let of_run: BTreeMap<String, (String, i64)> = (0..runs.rows())
        .filter(|&i| done[i])
        .filter_map(|i| Some((ids[i].clone()?, (encs[i].clone()?, ops[i]?))))
        .collect();
    let several = of_run
        .values()
        .map(|(e, _)| e)
        .collect::<BTreeSet<_>>()
        .len()
        > 1;
    let (c_ids, split, step, acc) = (
        curves.strs("run_id")?,
        curves.strs("split")?,
        curves.i64s("step")?,
        curves.f64s("answer_accuracy")?,
    );
    let answer_ops = if curves.has("answer_ops") {
        curves.i64s("answer_ops")?
    } else {
        vec![None; curves.rows()]
    };
    // (run, evaluated ops, step, answer accuracy) of every answer point of a finished run.
    let mut points = Vec::new();
    for i in 0..curves.rows() {
        let (Some(id), Some(s), Some(a)) = (&c_ids[i], step[i], acc[i]) else {
            continue;
        };
        let Some((e, k)) = of_run.get(id) else {
            continue;
        };
        let o = match split[i].as_deref() {
            Some("eval") => answer_ops[i].unwrap_or(*k),
            Some("answers") => match answer_ops[i] {
                Some(o) => o,
                None => continue,
            },
            _ => continue,
        };
        if a.is_finite() {
            points.push((e, *k, o, s, a));
        }
    }
    let trained: BTreeSet<i64> = points.iter().map(|p| p.1).collect();
    let mixed = trained.len() > 1 && points.iter().any(|p| p.1 != p.2);
    let mut by: BTreeMap<(usize, usize, String), BTreeMap<i64, Vec<f64>>> = BTreeMap::new();
    for (e, k, o, s, a) in points {
        let mut label = if several {
            format!("{e}, ops {o}")
        } else {
            format!("ops {o}")
        };
        if mixed {
            label.push_str(&format!(" (model ops {k})"));
        }
        by.entry((label_rank(e).0, o as usize * 1000 + k as usize, label))
            .or_default()
            .entry(s)
            .or_default()
            .push(a);
    }
    Ok(curves_from(by))
}

/// The curves of one task setting (one panel of `accuracy-vs-examples`).
#[derive(Clone, Debug, PartialEq)]
pub struct SettingCurves {
    /// The setting, e.g. `5–8 letters, |k| ≤ 2` or `5–8 letters, k = +1`, followed by the model
    /// and batch columns that differ between the folder's runs (`d_model 128`).
    pub setting: String,
    /// Held-out accuracy against thousands of training examples seen, one curve per encoding
    /// (PoPE with a uniform δ initialisation as its own curve), over seeds.
    pub curves: Vec<Curve>,
}

/// The indirect-indexing task of a runs row as a panel title: letters, the shift range and its
/// knobs (`min_abs_shift`, `shift_sign`; absent columns and nulls are the defaults, 0 and both).
fn indirect_setting(runs: &Table, i: usize) -> Result<String, PlotError> {
    let int = |c: &str| -> Result<Option<i64>, PlotError> {
        Ok(if runs.has(c) { runs.i64s(c)?[i] } else { None })
    };
    let (lo, hi, k) = (int("min_letters")?, int("max_letters")?, int("max_shift")?);
    let min_abs = int("min_abs_shift")?.unwrap_or(0);
    let sign = if runs.has("shift_sign") {
        runs.strs("shift_sign")?[i].clone()
    } else {
        None
    };
    let f = |v: Option<i64>| v.map_or("?".to_string(), |v| v.to_string());
    let shifts = match (sign.as_deref(), k) {
        (Some("positive"), Some(k)) if k == min_abs.max(1) => format!("k = +{k}"),
        (Some("negative"), Some(k)) if k == min_abs.max(1) => format!("k = −{k}"),
        (Some("positive"), _) => format!("k in +{}…+{}", min_abs.max(1), f(k)),
        (Some("negative"), _) => format!("k in −{}…−{}", f(k), min_abs.max(1)),
        _ if Some(min_abs) == k => format!("|k| = {min_abs}"),
        _ if min_abs > 0 => format!("{min_abs} ≤ |k| ≤ {}", f(k)),
        _ => format!("|k| ≤ {}", f(k)),
    };
    Ok(format!("{}–{} letters, {shifts}", f(lo), f(hi)))
}

/// Model and data columns that tell runs of one task setting apart in a panel title when they
/// differ within the folder.
const SETTING_EXTRAS: [&str; 6] = [
    "n_layers",
    "d_model",
    "n_heads",
    "batch_size",
    "train_examples",
    "lr",
];

/// Indirect indexing: held-out accuracy against the number of training examples seen (thousands:
/// step × `batch_size` / 1000), one panel per task setting, one curve per encoding over seeds
/// (the `curves` table's `eval` rows after step 0, joined to finished runs). PoPE runs with
/// `pope_delta_init = "uniform"` form their own curve, `pope δ-uniform`. Panels are ordered by
/// setting title.
///
/// # Errors
/// A missing column (`run_id`, `encoding`, `batch_size` in `runs`; `run_id`, `split`, `step`,
/// `accuracy` in `curves`).
pub fn accuracy_vs_examples(runs: &Table, curves: &Table) -> Result<Vec<SettingCurves>, PlotError> {
    let done = done_rows(runs)?;
    let ids = runs.strs("run_id")?;
    let encs = runs.strs("encoding")?;
    let batch = runs.i64s("batch_size")?;
    let delta = if runs.has("pope_delta_init") {
        runs.strs("pope_delta_init")?
    } else {
        vec![None; runs.rows()]
    };
    // Extra columns that vary over the finished runs.
    let mut extras: Vec<(&str, Vec<Option<String>>)> = Vec::new();
    for c in SETTING_EXTRAS {
        if !runs.has(c) {
            continue;
        }
        let vals: Vec<Option<String>> = match runs.data_type(c) {
            Some(arrow_schema::DataType::Float64) => runs
                .f64s(c)?
                .into_iter()
                .map(|v| v.map(super::draw::fmt_num))
                .collect(),
            _ => runs
                .i64s(c)?
                .into_iter()
                .map(|v| v.map(|v| v.to_string()))
                .collect(),
        };
        let distinct: BTreeSet<&Option<String>> = (0..runs.rows())
            .filter(|&i| done[i])
            .map(|i| &vals[i])
            .collect();
        if distinct.len() > 1 {
            extras.push((c, vals));
        }
    }
    let mut of_run: BTreeMap<String, (String, String, i64)> = BTreeMap::new();
    for i in (0..runs.rows()).filter(|&i| done[i]) {
        let (Some(id), Some(e), Some(b)) = (&ids[i], &encs[i], batch[i]) else {
            continue;
        };
        let mut setting = indirect_setting(runs, i)?;
        for (c, vals) in &extras {
            if let Some(v) = &vals[i] {
                setting.push_str(&format!(", {c} {v}"));
            }
        }
        let label = match (e.as_str(), delta[i].as_deref()) {
            ("pope", Some("uniform")) => "pope δ-uniform".to_string(),
            _ => e.clone(),
        };
        of_run.insert(id.clone(), (setting, label, b));
    }
    let (c_ids, split, step, acc) = (
        curves.strs("run_id")?,
        curves.strs("split")?,
        curves.i64s("step")?,
        curves.f64s("accuracy")?,
    );
    type ByLabel = BTreeMap<(usize, usize, String), BTreeMap<i64, Vec<f64>>>;
    let mut by: BTreeMap<String, ByLabel> = BTreeMap::new();
    // One value per (run, step): a run's curves may hold an evaluation twice (the final one).
    let mut seen: BTreeSet<(String, i64)> = BTreeSet::new();
    for i in 0..curves.rows() {
        if let (Some(id), Some("eval"), Some(s), Some(a)) =
            (&c_ids[i], split[i].as_deref(), step[i], acc[i])
            && s > 0
            && let Some((setting, label, b)) = of_run.get(id)
            && seen.insert((id.clone(), s))
        {
            by.entry(setting.clone())
                .or_default()
                .entry(label_rank(label))
                .or_default()
                .entry(s * b)
                .or_default()
                .push(a);
        }
    }
    Ok(by
        .into_iter()
        .map(|(setting, b)| SettingCurves {
            setting,
            curves: curves_from(b)
                .into_iter()
                .map(|mut c| {
                    c.points.iter_mut().for_each(|p| p.0 /= 1000.0);
                    c
                })
                .collect(),
        })
        .collect())
}

// ---------------------------------------------------------------------------------------------
// MI profiles

/// `(lag in tokens, lag in characters, mutual_info in nats, significant)`.
pub type MiPoint = (f64, f64, f64, bool);

/// One MI profile: mutual information against lag for one (corpus, granularity).
#[derive(Clone, Debug, PartialEq)]
pub struct MiProfile {
    /// Corpus name.
    pub corpus: String,
    /// Tokenisation granularity (`char`, `word`, a BPE size, …).
    pub granularity: String,
    /// `(lag in tokens, lag in characters, mutual_info in nats, significant)`, ascending lag.
    pub points: Vec<MiPoint>,
}

/// MI profiles from `mi.parquet` (`corpus`, `granularity`, `lag`, `lag_chars`, `mutual_info`,
/// `significant`), sorted by corpus then granularity; the points of each by lag.
pub fn mi_profiles(mi: &Table) -> Result<Vec<MiProfile>, PlotError> {
    let corpus = mi.strs("corpus")?;
    let gran = mi.strs("granularity")?;
    let lag = numeric(mi, "lag")?;
    let lag_chars = numeric(mi, "lag_chars")?;
    let info = mi.f64s("mutual_info")?;
    let sig = mi.bools("significant")?;
    let mut by: BTreeMap<(String, String), Vec<MiPoint>> = BTreeMap::new();
    for i in 0..mi.rows() {
        if let (Some(c), Some(g), Some(l), Some(lc), Some(v)) =
            (&corpus[i], &gran[i], lag[i], lag_chars[i], info[i])
        {
            by.entry((c.clone(), g.clone()))
                .or_default()
                .push((l, lc, v, sig[i].unwrap_or(false)));
        }
    }
    Ok(by
        .into_iter()
        .map(|((corpus, granularity), mut points)| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            MiProfile {
                corpus,
                granularity,
                points,
            }
        })
        .collect())
}

/// A column read as f64 whether it is stored as int64 or float64.
fn numeric(t: &Table, col: &str) -> Result<Vec<Option<f64>>, PlotError> {
    let f = t.f64s(col)?;
    if f.iter().any(Option::is_some) || t.rows() == 0 {
        return Ok(f);
    }
    Ok(t.i64s(col)?
        .into_iter()
        .map(|v| v.map(|x| x as f64))
        .collect())
}

/// The selection figure's data (docs/analysis-rules.md R58): per setting (a group's label
/// without its encoding and seed; `all` when nothing else varies), one [`Curve`] per encoding
/// of the validation metric against the first selection axis's value, the seeds pooled into
/// each point's [`Stat`]. Candidates without the metric (failed, unfinished) are left out; an
/// axis value that is not a number leaves its candidate out.
pub fn selection_curves(choices: &[crate::analysis::select::Choice]) -> Vec<(String, Vec<Curve>)> {
    // setting → encoding → x → values
    let mut by: BTreeMap<String, BTreeMap<String, BTreeMap<u64, (f64, Vec<f64>)>>> =
        BTreeMap::new();
    for c in choices {
        let mut encoding = String::from("run");
        let setting: Vec<&str> = c
            .label
            .split(' ')
            .filter(|w| !w.is_empty())
            .filter(|w| {
                if let Some(e) = w.strip_prefix("encoding=") {
                    encoding = e.to_string();
                    false
                } else {
                    !w.starts_with("seed=")
                }
            })
            .collect();
        let setting = if setting.is_empty() {
            "all".to_string()
        } else {
            setting.join(" ")
        };
        for (words, metric, _) in &c.candidates {
            let (Some(m), Some(x)) = (
                metric,
                words
                    .split(' ')
                    .next()
                    .and_then(|w| w.split_once('='))
                    .and_then(|(_, v)| v.parse::<f64>().ok()),
            ) else {
                continue;
            };
            by.entry(setting.clone())
                .or_default()
                .entry(encoding.clone())
                .or_default()
                .entry(x.to_bits())
                .or_insert_with(|| (x, Vec::new()))
                .1
                .push(*m);
        }
    }
    by.into_iter()
        .map(|(setting, encs)| {
            let curves = encs
                .into_iter()
                .map(|(label, pts)| {
                    let mut points: Vec<(f64, Stat)> = pts
                        .into_values()
                        .filter_map(|(x, v)| Stat::of(v).map(|s| (x, s)))
                        .collect();
                    points.sort_by(|a, b| a.0.total_cmp(&b.0));
                    Curve { label, points }
                })
                .collect();
            (setting, curves)
        })
        .collect()
}
